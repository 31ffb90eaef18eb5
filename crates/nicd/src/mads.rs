//! The MAD services of a port the daemon's clients share, sans-IO: the
//! seeds' proxy agent (seed 000) and MAD dispatcher (seed 004) between
//! one QP1 and many processes.
//!
//! # The split
//!
//! The daemon owns each port's QP1. A client gets a place at it (its own
//! GSI QP handle, served by the client provider) and runs its access
//! layer as it would over a QP1 of its own: the CM state machines, the
//! MAD dispatcher with its retries and RMPP, the SA client and the DM
//! agent stay in `rdma-access`, in the client's process, and the
//! [`Router`] here only decides which process each MAD belongs to. So
//! there is one CM state machine (the access layer's), not a second one
//! behind RPCs in the daemon, and a tool runs the same code over the
//! daemon as over an in-process NIC; the daemon keeps just what it needs
//! to route and to clean up after a client that dies.
//!
//! # Routing
//!
//! - **CM** (class 0x07, method Send): a REQ goes to the client that
//!   listens on its service ID ([`Router::listen`]; none: the daemon
//!   answers REJ 8, invalid service ID). Every other CM message names
//!   its receiver's communication ID (the remote one, IBA 12.6): the
//!   daemon gives each connection of a client an ID of its own, puts it
//!   in place of the client's local ID on the way out and the client's
//!   back on the way in, so IDs the clients pick never collide, and a
//!   client reaches only its own connections. A client may answer only a
//!   REQ it was handed, and only name the peer's ID of its own
//!   connections. SIDR is not served (dropped).
//! - **Other classes**: a request a client sends gets a transaction ID
//!   the daemon stamps (the client's own comes back in the response);
//!   responses find their client by that stamp. Unsolicited requests go
//!   to the client serving their class, version and method
//!   ([`Router::register`]); one nobody serves is answered with a status
//!   (IBA 13.4.7: bad version when nobody serves the class, method
//!   unsupported when someone does), except Send, Trap, Report and
//!   TrapRepress, which are never answered. The SA's Reports (class
//!   0x03) go to every client that registered for them: an SA client
//!   takes them to learn of its subscriptions' events, it serves nothing,
//!   so any client may, and each answers with its ReportResp.
//!
//! # Refusals
//!
//! SMPs (classes 0x01, 0x81: QP0's) are refused to everyone (dropped
//! from the wire: RoCE has no QP0). A client may send a response only of
//! a class it serves; serving subnet administration (0x03) or
//! performance management (0x04) needs a privileged client (root or the
//! daemon's user); a method another client serves, or a service another
//! client listens on, is refused.
//!
//! # A client that goes
//!
//! [`Router::leave`] forgets its registrations, listens and stamps, and
//! ends its connections as Linux's CM does for a destroyed ID (IBA
//! 12.9.6): established ones with a DREQ, those half way with a REJ
//! (consumer defined), a REQ it was handed and never answered with a REJ.
//! A passive connection whose RTU the daemon has not seen gets both a
//! REJ and a DREQ: the peer may have sent its RTU (then it is
//! established and takes the DREQ) or not (it takes the REJ).
//! Their IDs stay behind as tombstones, so a REP that comes later gets a
//! REJ and a DREQ a DREP, and the peer never waits for a time-out. A
//! DREQ is sent again at each [`Router::retransmit`] (the driver calls
//! it once a second) until the peer's DREP, at most [`DREQ_RESENDS`]
//! times.

use rdma_mad::cm::{
    CmAttr, DreqRepr, IdsRepr, MsgRef, RejReason, RejRepr, RepRepr, ReqRepr, CM_CLASS_VERSION,
};
use rdma_mad::mad::{HEADER_LEN, MAD_SIZE};
use rdma_types::{Gid, Qpn};
use std::collections::{HashMap, VecDeque};

/// A client, by the daemon's number for it.
pub type ClientId = u64;

/// A 256-byte MAD.
pub type MadBytes = Box<[u8; MAD_SIZE]>;

/// Transaction IDs remembered for responses (oldest forgotten first).
pub const MAX_TIDS: usize = 4096;

/// How many times a DREQ for a departed client is sent again.
pub const DREQ_RESENDS: u8 = 3;

/// Connections of departed clients kept to answer their peers, and REQs
/// handed to clients and not answered yet (oldest forgotten first).
pub const MAX_TOMBSTONES: usize = 4096;

const CLASS_CM: u8 = 0x07;
const CLASS_SA: u8 = 0x03;
const CLASS_PERF: u8 = 0x04;
const METHOD_SEND: u8 = 0x03;
const METHOD_REPORT: u8 = 0x06;
const RESPONSE: u8 = 0x80;

fn is_smp(class: u8) -> bool {
    class == 0x01 || class == 0x81
}

/// What the router asks its driver to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Out {
    /// A receive on `client`'s GSI QP.
    ToClient {
        /// Whose.
        client: ClientId,
        /// Sender.
        sgid: Gid,
        /// The receive's P_Key index.
        pkey_index: u16,
        /// The MAD.
        mad: MadBytes,
    },
    /// A send from the port's QP1 to QP1 of the port at `dgid`.
    ToWire {
        /// Destination.
        dgid: Gid,
        /// P_Key index to send with.
        pkey_index: u16,
        /// The MAD.
        mad: MadBytes,
    },
}

/// Why a client's registration, listen or MAD was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// Classes 0x01 and 0x81 travel on QP0, which the daemon keeps.
    #[error("SMPs (class {0:#04x}) travel on QP0, which nicd keeps to itself")]
    Qp0(u8),
    /// Serving this class needs root or the daemon's user.
    #[error("serving class {0:#04x} needs root or nicd's user")]
    Privileged(u8),
    /// Another client serves that method.
    #[error("class {class:#04x} version {version} method {method:#04x} is served by another nicd client")]
    Taken {
        /// Class.
        class: u8,
        /// Version.
        version: u8,
        /// Method.
        method: u8,
    },
    /// Another client listens on that service.
    #[error("service ID {0:#x} is listened on by another nicd client")]
    Listened(u64),
    /// The MAD is not one a client may send (in words).
    #[error("{0}")]
    Mad(String),
}

/// Counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// MADs handed to clients.
    pub delivered: u64,
    /// MADs from the wire nobody could take (dropped).
    pub dropped: u64,
    /// Registrations, listens and MADs of clients refused.
    pub refused: u64,
    /// Status replies to requests nobody serves, and REJs of REQs for
    /// services nobody listens on.
    pub unserved: u64,
    /// DREQs and REJs sent for departed clients.
    pub ended_for_dead: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    ReqSent,
    ReqRcvd,
    RepSent,
    RepRcvd,
    Established,
    Closing,
}

#[derive(Debug, Clone)]
struct Conn {
    /// `None` once the client is gone (a tombstone).
    client: Option<ClientId>,
    /// The client's own ID for it.
    local: u32,
    peer: Gid,
    /// The peer's ID (0 until its REQ or REP is seen).
    peer_comm: u32,
    peer_qpn: Qpn,
    pkey_index: u16,
    phase: Phase,
    /// Resends left of the DREQ sent for a departed client.
    dreq_resends: u8,
}

/// A REQ handed to a client, not answered yet.
#[derive(Debug, Clone, Copy)]
struct Offer {
    client: ClientId,
    peer_qpn: Qpn,
    pkey_index: u16,
}

/// The routing state of one port (see the module docs).
#[derive(Debug, Default)]
pub struct Router {
    privileged: HashMap<ClientId, bool>,
    serves: HashMap<(u8, u8, u8), ClientId>,
    /// The SA's Reports by class version: every client that takes them.
    reports: HashMap<u8, Vec<ClientId>>,
    listens: HashMap<u64, ClientId>,
    /// Stamped TID → client and its TID.
    tids: HashMap<u64, (ClientId, u64)>,
    stamps: HashMap<(ClientId, u64), u64>,
    tid_order: VecDeque<u64>,
    next_tid: u32,
    /// The daemon's communication ID → connection.
    conns: HashMap<u32, Conn>,
    local_ids: HashMap<(ClientId, u32), u32>,
    tombstones: VecDeque<u32>,
    offers: HashMap<(Gid, u32), Offer>,
    offer_order: VecDeque<(Gid, u32)>,
    next_comm: u32,
    stats: Stats,
}

fn u32_at(m: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(m[at..at + 4].try_into().expect("4 bytes"))
}

fn put_u32(m: &mut [u8], at: usize, v: u32) {
    m[at..at + 4].copy_from_slice(&v.to_be_bytes());
}

fn tid_of(m: &[u8]) -> u64 {
    u64::from_be_bytes(m[8..16].try_into().expect("8 bytes"))
}

fn set_tid(m: &mut [u8], tid: u64) {
    m[8..16].copy_from_slice(&tid.to_be_bytes());
}

fn attr_of(m: &[u8]) -> CmAttr {
    CmAttr::from(u16::from_be_bytes([m[16], m[17]]))
}

/// A CM Send MAD of `attr` with `tid` around 232 bytes of `data`.
fn cm_mad(attr: CmAttr, tid: u64, emit: impl FnOnce(&mut [u8])) -> MadBytes {
    let mut m = Box::new([0u8; MAD_SIZE]);
    rdma_mad::cm::CmMadRepr::header_for(attr, tid).emit(&mut m[..]);
    emit(&mut m[HEADER_LEN..]);
    m
}

/// The DREQ of connection `id` for its departed client.
fn dreq_for(id: u32, c: &Conn) -> MadBytes {
    cm_mad(CmAttr::Dreq, 0, |b| {
        DreqRepr {
            local_comm_id: id,
            remote_comm_id: c.peer_comm,
            remote_qpn: c.peer_qpn,
            private_data: [0; rdma_mad::cm::private_len::DREQ],
        }
        .emit(b)
    })
}

fn rej(tid: u64, local: u32, remote: u32, what: MsgRef, reason: RejReason) -> MadBytes {
    cm_mad(CmAttr::Rej, tid, |d| {
        RejRepr {
            local_comm_id: local,
            remote_comm_id: remote,
            message_rejected: what,
            reject_info_len: 0,
            reason,
            ari: [0; rdma_mad::cm::private_len::REJ_ARI],
            private_data: [0; rdma_mad::cm::private_len::REJ],
        }
        .emit(d)
    })
}

impl Router {
    /// A router whose communication IDs start after `seed` (vary it per
    /// daemon run, as a CM varies its first ID).
    pub fn new(seed: u32) -> Router {
        Router {
            next_comm: seed,
            next_tid: seed,
            ..Router::default()
        }
    }

    /// Counters.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// Connections the router knows of, tombstones included.
    pub fn connections(&self) -> usize {
        self.conns.len()
    }

    /// `client` takes a place at the port; `privileged` (root or the
    /// daemon's user) may serve every class but the SMPs'.
    pub fn join(&mut self, client: ClientId, privileged: bool) {
        self.privileged.insert(client, privileged);
    }

    fn refuse<T>(&mut self, why: Refused) -> Result<T, Refused> {
        self.stats.refused += 1;
        Err(why)
    }

    /// `client` serves `methods` of `class`, `version` (`serve`), or no
    /// longer. The CM class needs no registration (its REQs come by
    /// listens): accepted and ignored.
    ///
    /// # Errors
    /// See [`Refused`]; nothing is registered then.
    pub fn register(
        &mut self,
        client: ClientId,
        class: u8,
        version: u8,
        methods: &[u8],
        serve: bool,
    ) -> Result<(), Refused> {
        // The SA's Reports (its notices to subscribers, IBA 15.4.8): an SA
        // client takes them, it does not serve the class. Each client of
        // the port that subscribed gets every one; any client may.
        if class == CLASS_SA && methods == [METHOD_REPORT] {
            let takers = self.reports.entry(version).or_default();
            takers.retain(|c| *c != client);
            if serve {
                takers.push(client);
            }
            return Ok(());
        }
        if !serve {
            for &m in methods {
                if self.serves.get(&(class, version, m)) == Some(&client) {
                    self.serves.remove(&(class, version, m));
                }
            }
            return Ok(());
        }
        if is_smp(class) {
            return self.refuse(Refused::Qp0(class));
        }
        if class == CLASS_CM {
            return Ok(());
        }
        let privileged = self.privileged.get(&client).copied().unwrap_or(false);
        if (class == CLASS_SA || class == CLASS_PERF) && !privileged {
            return self.refuse(Refused::Privileged(class));
        }
        for &method in methods {
            if method & RESPONSE != 0 {
                return self.refuse(Refused::Mad(format!(
                    "method {method:#04x} is a response: responses find their requester by \
                     transaction ID, they are not registered"
                )));
            }
            match self.serves.get(&(class, version, method)) {
                Some(&c) if c != client => {
                    return self.refuse(Refused::Taken {
                        class,
                        version,
                        method,
                    })
                }
                _ => {}
            }
        }
        for &m in methods {
            self.serves.insert((class, version, m), client);
        }
        Ok(())
    }

    /// Whether some client serves requests of management class `class`.
    pub fn serves_class(&self, class: u8) -> bool {
        self.serves.keys().any(|&(c, _, _)| c == class)
    }

    /// `client` listens on `service_id` (`listen`), or no longer.
    ///
    /// # Errors
    /// [`Refused::Listened`] when another client listens on it.
    pub fn listen(
        &mut self,
        client: ClientId,
        service_id: u64,
        listen: bool,
    ) -> Result<(), Refused> {
        match (self.listens.get(&service_id).copied(), listen) {
            (Some(c), true) if c != client => self.refuse(Refused::Listened(service_id)),
            (_, true) => {
                self.listens.insert(service_id, client);
                Ok(())
            }
            (Some(c), false) if c == client => {
                self.listens.remove(&service_id);
                Ok(())
            }
            (_, false) => Ok(()),
        }
    }

    fn new_comm_id(&mut self) -> u32 {
        loop {
            self.next_comm = self.next_comm.wrapping_add(1);
            if self.next_comm != 0 && !self.conns.contains_key(&self.next_comm) {
                return self.next_comm;
            }
        }
    }

    fn stamp(&mut self, client: ClientId, tid: u64) -> u64 {
        if let Some(&s) = self.stamps.get(&(client, tid)) {
            return s;
        }
        let stamped = loop {
            self.next_tid = self.next_tid.wrapping_add(1);
            let s = (u64::from(client as u32) << 32) | u64::from(self.next_tid);
            if !self.tids.contains_key(&s) {
                break s;
            }
        };
        self.tids.insert(stamped, (client, tid));
        self.stamps.insert((client, tid), stamped);
        self.tid_order.push_back(stamped);
        while self.tid_order.len() > MAX_TIDS {
            if let Some(old) = self.tid_order.pop_front() {
                if let Some(k) = self.tids.remove(&old) {
                    self.stamps.remove(&k);
                }
            }
        }
        stamped
    }

    fn bury(&mut self, id: u32) {
        self.tombstones.push_back(id);
        while self.tombstones.len() > MAX_TOMBSTONES {
            if let Some(old) = self.tombstones.pop_front() {
                if self.conns.get(&old).is_some_and(|c| c.client.is_none()) {
                    self.conns.remove(&old);
                }
            }
        }
    }

    fn forget(&mut self, id: u32) {
        if let Some(c) = self.conns.remove(&id) {
            if let Some(client) = c.client {
                self.local_ids.remove(&(client, c.local));
            }
        }
    }

    /// A MAD `client` posts on its GSI QP, to QP1 at `dgid`: what goes
    /// on the wire.
    ///
    /// # Errors
    /// See [`Refused`]; nothing is sent then.
    pub fn from_client(
        &mut self,
        client: ClientId,
        dgid: Gid,
        pkey_index: u16,
        mad: &[u8],
    ) -> Result<Vec<Out>, Refused> {
        let Ok(m) = <[u8; MAD_SIZE]>::try_from(mad) else {
            return self.refuse(Refused::Mad(format!(
                "a MAD is {MAD_SIZE} bytes, not {}",
                mad.len()
            )));
        };
        let mut m = Box::new(m);
        let (class, method) = (m[1], m[3]);
        if m[0] != 1 {
            return self.refuse(Refused::Mad(format!("base version {} is not 1", m[0])));
        }
        if is_smp(class) {
            return self.refuse(Refused::Qp0(class));
        }
        if class == CLASS_CM && m[2] == CM_CLASS_VERSION && method == METHOD_SEND {
            self.cm_out(client, dgid, &mut m)?;
        } else if method & RESPONSE != 0 {
            let version = m[2];
            let serves = self
                .serves
                .iter()
                .any(|(&(c, v, _), &who)| c == class && v == version && who == client)
                || (class == CLASS_SA
                    && method == METHOD_REPORT | RESPONSE
                    && self
                        .reports
                        .get(&version)
                        .is_some_and(|t| t.contains(&client)));
            let tid = tid_of(&m[..]);
            match self.stamps.get(&(client, tid)) {
                // An RMPP ACK of a response to this client's request.
                Some(&s) => set_tid(&mut m[..], s),
                None if serves => {}
                None => {
                    return self.refuse(Refused::Mad(format!(
                        "a response of class {class:#04x} version {version}, which this client \
                         does not serve"
                    )))
                }
            }
        } else {
            let s = self.stamp(client, tid_of(&m[..]));
            set_tid(&mut m[..], s);
        }
        Ok(vec![Out::ToWire {
            dgid,
            pkey_index,
            mad: m,
        }])
    }

    fn cm_out(
        &mut self,
        client: ClientId,
        dgid: Gid,
        m: &mut [u8; MAD_SIZE],
    ) -> Result<(), Refused> {
        let attr = attr_of(&m[..]);
        let d = HEADER_LEN;
        let local = u32_at(&m[..], d);
        let remote = u32_at(&m[..], d + 4);
        if matches!(attr, CmAttr::SidrReq | CmAttr::SidrRep) {
            return self.refuse(Refused::Mad("SIDR is not served through nicd".into()));
        }
        let known = self.local_ids.get(&(client, local)).copied();
        let id = match (attr, known) {
            (CmAttr::Req, Some(id)) => id,
            (CmAttr::Req, None) => {
                let id = self.new_comm_id();
                self.conns.insert(
                    id,
                    Conn {
                        client: Some(client),
                        local,
                        peer: dgid,
                        peer_comm: 0,
                        peer_qpn: Qpn::from_bits(0),
                        pkey_index: 0,
                        phase: Phase::ReqSent,
                        dreq_resends: 0,
                    },
                );
                self.local_ids.insert((client, local), id);
                id
            }
            (_, Some(id)) => {
                let c = &self.conns[&id];
                let ok = c.peer == dgid && (remote == 0 || c.peer_comm == remote);
                let late = c.peer_comm == 0
                    && self
                        .offers
                        .get(&(dgid, remote))
                        .is_some_and(|o| o.client == client);
                if !ok && !late {
                    return self.refuse(Refused::Mad(format!(
                        "a CM {attr} naming connection {remote:#x} at {dgid}, which is not this \
                         client's"
                    )));
                }
                id
            }
            (_, None) => {
                // The first answer to a REQ this client was handed.
                let Some(o) = self
                    .offers
                    .get(&(dgid, remote))
                    .copied()
                    .filter(|o| o.client == client)
                else {
                    return self.refuse(Refused::Mad(format!(
                        "a CM {attr} for connection {remote:#x} at {dgid}: no REQ of it was \
                         handed to this client"
                    )));
                };
                self.offers.remove(&(dgid, remote));
                let id = self.new_comm_id();
                self.conns.insert(
                    id,
                    Conn {
                        client: Some(client),
                        local,
                        peer: dgid,
                        peer_comm: remote,
                        peer_qpn: o.peer_qpn,
                        pkey_index: o.pkey_index,
                        phase: Phase::ReqRcvd,
                        dreq_resends: 0,
                    },
                );
                self.local_ids.insert((client, local), id);
                id
            }
        };
        put_u32(&mut m[..], d, id);
        let c = self.conns.get_mut(&id).expect("just found");
        if c.peer_comm == 0 && remote != 0 {
            c.peer_comm = remote;
            self.offers.remove(&(dgid, remote));
        }
        match attr {
            CmAttr::Rep => c.phase = Phase::RepSent,
            CmAttr::Rtu => c.phase = Phase::Established,
            CmAttr::Dreq => c.phase = Phase::Closing,
            CmAttr::Rej | CmAttr::Drep => self.forget(id),
            _ => {}
        }
        Ok(())
    }

    /// A MAD from the wire (QP1 of the port at `sgid`): what goes to
    /// clients and what goes back on the wire. Anything malformed or
    /// unclaimed is dropped (counted).
    pub fn from_wire(&mut self, sgid: Gid, pkey_index: u16, mad: &[u8]) -> Vec<Out> {
        let mut m = Box::new([0u8; MAD_SIZE]);
        let n = mad.len().min(MAD_SIZE);
        m[..n].copy_from_slice(&mad[..n]);
        if n < HEADER_LEN || m[0] != 1 || is_smp(m[1]) {
            self.stats.dropped += 1;
            return Vec::new();
        }
        let (class, version, method) = (m[1], m[2], m[3]);
        if class == CLASS_CM && version == CM_CLASS_VERSION && method == METHOD_SEND {
            return self.cm_in(sgid, pkey_index, m);
        }
        if method & RESPONSE != 0 {
            let Some(&(client, tid)) = self.tids.get(&tid_of(&m[..])) else {
                self.stats.dropped += 1;
                return Vec::new();
            };
            set_tid(&mut m[..], tid);
            return self.deliver(client, sgid, pkey_index, m);
        }
        if class == CLASS_SA && method == METHOD_REPORT {
            let takers = self.reports.get(&version).cloned().unwrap_or_default();
            if !takers.is_empty() {
                let mut out = Vec::new();
                for client in takers {
                    out.extend(self.deliver(client, sgid, pkey_index, m.clone()));
                }
                return out;
            }
        }
        if let Some(&client) = self.serves.get(&(class, version, method)) {
            return self.deliver(client, sgid, pkey_index, m);
        }
        // IBA 13.4.7: no answer to these.
        if matches!(method, 0x03 | 0x05 | 0x06 | 0x07) {
            self.stats.dropped += 1;
            return Vec::new();
        }
        self.stats.unserved += 1;
        let class_served = self
            .serves
            .keys()
            .any(|&(c, v, _)| c == class && v == version);
        // Status code 2 (method unsupported) or 1 (bad version), bits 2-4.
        let status: u16 = if class_served { 2 << 2 } else { 1 << 2 };
        // A Set is answered with GetResp; every other request with its
        // own response method.
        m[3] = if method == 0x02 {
            0x81
        } else {
            method | RESPONSE
        };
        m[4..6].copy_from_slice(&status.to_be_bytes());
        vec![Out::ToWire {
            dgid: sgid,
            pkey_index,
            mad: m,
        }]
    }

    fn deliver(&mut self, client: ClientId, sgid: Gid, pkey_index: u16, mad: MadBytes) -> Vec<Out> {
        self.stats.delivered += 1;
        vec![Out::ToClient {
            client,
            sgid,
            pkey_index,
            mad,
        }]
    }

    fn cm_in(&mut self, sgid: Gid, pkey_index: u16, mut m: MadBytes) -> Vec<Out> {
        let attr = attr_of(&m[..]);
        let tid = tid_of(&m[..]);
        let d = HEADER_LEN;
        if attr == CmAttr::Req {
            let Ok(req) = ReqRepr::parse(&m[d..]) else {
                self.stats.dropped += 1;
                return Vec::new();
            };
            let Some(&client) = self.listens.get(&req.service_id) else {
                self.stats.unserved += 1;
                let r = rej(
                    tid,
                    0,
                    req.local_comm_id,
                    MsgRef::Req,
                    RejReason::InvalidServiceId,
                );
                return vec![Out::ToWire {
                    dgid: sgid,
                    pkey_index,
                    mad: r,
                }];
            };
            let key = (sgid, req.local_comm_id);
            let answered = self
                .conns
                .values()
                .any(|c| c.peer == sgid && c.peer_comm == req.local_comm_id);
            if !answered && !self.offers.contains_key(&key) {
                self.offers.insert(
                    key,
                    Offer {
                        client,
                        peer_qpn: req.local_qpn,
                        pkey_index,
                    },
                );
                self.offer_order.push_back(key);
                while self.offer_order.len() > MAX_TOMBSTONES {
                    if let Some(old) = self.offer_order.pop_front() {
                        self.offers.remove(&old);
                    }
                }
            }
            return self.deliver(client, sgid, pkey_index, m);
        }
        if matches!(attr, CmAttr::SidrReq | CmAttr::SidrRep) {
            self.stats.dropped += 1;
            return Vec::new();
        }
        let peer_comm = u32_at(&m[..], d);
        let id = u32_at(&m[..], d + 4);
        let Some(c) = self.conns.get_mut(&id).filter(|c| c.peer == sgid) else {
            self.stats.dropped += 1;
            return Vec::new();
        };
        let Some(client) = c.client else {
            // A tombstone: answer for the departed client.
            let out = match attr {
                CmAttr::Rep => Some(rej(
                    tid,
                    id,
                    peer_comm,
                    MsgRef::Rep,
                    RejReason::ConsumerDefined,
                )),
                CmAttr::Dreq => Some(cm_mad(CmAttr::Drep, tid, |b| {
                    IdsRepr {
                        local_comm_id: id,
                        remote_comm_id: peer_comm,
                        private_data: [0; rdma_mad::cm::private_len::DREP],
                    }
                    .emit(b)
                })),
                _ => None,
            };
            if matches!(
                attr,
                CmAttr::Rep | CmAttr::Dreq | CmAttr::Drep | CmAttr::Rej
            ) {
                self.conns.remove(&id);
            }
            return match out {
                Some(mad) => {
                    self.stats.ended_for_dead += 1;
                    vec![Out::ToWire {
                        dgid: sgid,
                        pkey_index,
                        mad,
                    }]
                }
                None => {
                    self.stats.dropped += 1;
                    Vec::new()
                }
            };
        };
        if c.peer_comm == 0 {
            c.peer_comm = peer_comm;
        }
        match attr {
            CmAttr::Rep => {
                c.phase = Phase::RepRcvd;
                if let Ok(rep) = RepRepr::parse(&m[d..]) {
                    c.peer_qpn = rep.local_qpn;
                }
                c.pkey_index = pkey_index;
            }
            CmAttr::Rtu => c.phase = Phase::Established,
            CmAttr::Dreq => c.phase = Phase::Closing,
            _ => {}
        }
        put_u32(&mut m[..], d + 4, c.local);
        if matches!(attr, CmAttr::Rej | CmAttr::Drep) {
            self.forget(id);
        }
        self.deliver(client, sgid, pkey_index, m)
    }

    /// The DREQs of departed clients' connections whose peers have not
    /// answered, sent again (each at most [`DREQ_RESENDS`] times; the
    /// driver calls this once a second).
    pub fn retransmit(&mut self) -> Vec<Out> {
        let mut out = Vec::new();
        let mut ids: Vec<u32> = self
            .conns
            .iter()
            .filter(|(_, c)| c.client.is_none() && c.dreq_resends > 0)
            .map(|(id, _)| *id)
            .collect();
        ids.sort_unstable();
        for id in ids {
            let c = self.conns.get_mut(&id).expect("listed");
            c.dreq_resends -= 1;
            out.push(Out::ToWire {
                dgid: c.peer,
                pkey_index: c.pkey_index,
                mad: dreq_for(id, c),
            });
        }
        out
    }

    /// `client` is gone: its registrations, listens and stamps are
    /// forgotten and its connections ended (see the module docs).
    pub fn leave(&mut self, client: ClientId) -> Vec<Out> {
        self.privileged.remove(&client);
        self.serves.retain(|_, c| *c != client);
        self.reports
            .values_mut()
            .for_each(|t| t.retain(|c| *c != client));
        self.listens.retain(|_, c| *c != client);
        self.tids.retain(|_, (c, _)| *c != client);
        self.stamps.retain(|(c, _), _| *c != client);
        let mut out = Vec::new();
        let offers: Vec<((Gid, u32), Offer)> = self
            .offers
            .iter()
            .filter(|(_, o)| o.client == client)
            .map(|(k, o)| (*k, *o))
            .collect();
        for ((peer, peer_comm), o) in offers {
            self.offers.remove(&(peer, peer_comm));
            let id = self.new_comm_id();
            out.push(Out::ToWire {
                dgid: peer,
                pkey_index: o.pkey_index,
                mad: rej(0, id, peer_comm, MsgRef::Req, RejReason::ConsumerDefined),
            });
        }
        let mut mine: Vec<u32> = self
            .conns
            .iter()
            .filter(|(_, c)| c.client == Some(client))
            .map(|(id, _)| *id)
            .collect();
        mine.sort_unstable();
        for id in mine {
            let c = self.conns.get_mut(&id).expect("listed");
            c.client = None;
            if matches!(c.phase, Phase::Established | Phase::RepSent) {
                c.dreq_resends = DREQ_RESENDS;
            }
            let c = c.clone();
            self.local_ids.remove(&(client, c.local));
            let to = |mad| Out::ToWire {
                dgid: c.peer,
                pkey_index: c.pkey_index,
                mad,
            };
            let dreq = || dreq_for(id, &c);
            let rej_of = |what| rej(0, id, c.peer_comm, what, RejReason::ConsumerDefined);
            let end = match c.phase {
                Phase::Established => vec![dreq()],
                Phase::ReqRcvd => vec![rej_of(MsgRef::Req)],
                Phase::RepRcvd => vec![rej_of(MsgRef::Rep)],
                // The peer may have sent its RTU already (it is
                // established, and takes the DREQ) or not (it takes the
                // REJ and ignores the DREQ).
                Phase::RepSent => vec![rej_of(MsgRef::Other), dreq()],
                Phase::ReqSent | Phase::Closing => Vec::new(),
            };
            out.extend(end.into_iter().map(to));
            self.bury(id);
        }
        self.stats.ended_for_dead += out.len() as u64;
        out
    }
}

#[cfg(test)]
mod tests;
