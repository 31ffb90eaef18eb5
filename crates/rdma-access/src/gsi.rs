//! The general services interface of a port, sans-IO: many MAD agents
//! share QP1.
//!
//! An agent registers a management class, class version and the request
//! methods it serves; a registration that overlaps another's is refused.
//! Requests an agent sends get a transaction ID with the agent's number in
//! the upper 32 bits (as Linux numbers them), are sent again after
//! `timeout` up to `retries` times, and end with the matching response or
//! a timeout, delivered to that agent. Unsolicited requests go to the agent
//! registered for their class, version and method. A request nobody
//! serves is answered with a status (IBA 13.4.7): "bad version" when no
//! agent has the class and version (or the base version is not 1),
//! "method unsupported" when the class is served but not the method; a
//! directed-route SMP's status also gets the direction bit. Responses,
//! Send, Trap and TrapRepress are never answered. MADs shorter than a
//! header, or responses nobody waits for, are dropped and counted.
//!
//! RMPP (IBA 13.6) for the classes that carry its header (SA, vendor
//! classes with OUI): a segmented response to one of our requests is
//! reassembled, each in-order DATA segment acknowledged with a window of
//! [`RMPP_WINDOW`] more, and delivered whole (header of the first segment,
//! then all the data); a lost segment shows as a stalled transfer, and the
//! request's timer then sends the request again (the responder answers
//! afresh, from segment 1). [`Dispatcher::send_rmpp`] is the active sender
//! of a response too large for one MAD: it starts with a window of one
//! segment, sends on as ACKs open the window, resends unacknowledged
//! segments on timeout and gives up after its retries; STOP and ABORT end
//! it.
//!
//! The CM class is one agent like the others (the CM agent registers
//! class 0x07 version 2 for Send).
//!
//! Partitions: a GMP carries its sender's P_Key, and the answer goes back
//! in the same partition. The driver hands each MAD in with the P_Key
//! index its receive reported ([`Dispatcher::handle_mad_in`]); the
//! dispatcher remembers it for the last [`REQUEST_PKEYS`] requests, and
//! [`Dispatcher::pkey_index_for`] gives the index a response (an agent's,
//! a status reply, an RMPP segment) must be sent with. Everything else
//! goes with the QP's own index (the port's default partition).

use crate::retries::{Due, Retries};
use rdma_mad::mad::{Mad, MadStatus, Method, StatusCode, HEADER_LEN, MAD_SIZE};
use rdma_mad::rmpp::{self, RmppHeader, RmppType, FLAG_ACTIVE, FLAG_FIRST, FLAG_LAST};
use rdma_types::{Duration, Gid, Instant};
use std::collections::{BTreeMap, HashMap, VecDeque};

/// A 256-byte MAD.
pub type MadBytes = [u8; MAD_SIZE];

/// Received requests whose P_Key index is remembered for their response.
pub const REQUEST_PKEYS: usize = 256;

/// How many segments past the last one received an RMPP receiver lets the
/// sender send.
pub const RMPP_WINDOW: u32 = 32;

/// Classes whose MADs carry an RMPP header: subnet administration and the
/// vendor classes with an OUI (0x30-0x4F).
pub fn is_rmpp_class(class: u8) -> bool {
    class == 0x03 || (0x30..=0x4f).contains(&class)
}

/// Where an RMPP class's data starts (common, RMPP and class headers).
pub fn rmpp_hdr_len(class: u8) -> usize {
    if class == 0x03 {
        rdma_mad::sa::SA_HDR_LEN
    } else {
        40 // common + RMPP headers + OUI word
    }
}

/// An agent's number on its port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AgentId(pub u32);

/// Why a registration was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegisterError {
    /// Another agent serves one of the methods of this class and version.
    #[error("class {class:#04x} version {version}: method {method:#04x} is already served by agent {other}")]
    Conflict {
        /// Management class.
        class: u8,
        /// Class version.
        version: u8,
        /// The method both want.
        method: u8,
        /// The agent that has it.
        other: u32,
    },
    /// Responses (R bit set) are routed by transaction ID, not registered.
    #[error("method {0:#04x} is a response")]
    ResponseMethod(u8),
}

/// What the dispatcher hands to agents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delivery {
    /// An unsolicited request for `agent`.
    Request {
        /// The agent serving it.
        agent: AgentId,
        /// Sender.
        peer: Gid,
        /// The MAD.
        mad: Box<MadBytes>,
    },
    /// The response to `tid`: one MAD (256 bytes) or, for an RMPP
    /// transfer, the first segment's headers followed by all the data.
    Response {
        /// The requesting agent.
        agent: AgentId,
        /// Transaction ID.
        tid: u64,
        /// The MAD.
        mad: Vec<u8>,
    },
    /// `tid` got no response after every retry.
    TimedOut {
        /// The requesting agent.
        agent: AgentId,
        /// Transaction ID.
        tid: u64,
    },
}

/// Counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GsiStats {
    /// MADs handed in.
    pub received: u64,
    /// Dropped: too short, wrong base version, or a response nobody waits for.
    pub dropped: u64,
    /// Requests answered with a status because nobody serves them.
    pub status_replies: u64,
    /// Requests sent again after a timeout.
    pub retries: u64,
    /// Requests that timed out for good.
    pub timeouts: u64,
    /// RMPP DATA segments received in order.
    pub rmpp_segments_in: u64,
    /// RMPP DATA segments sent (first sends and resends).
    pub rmpp_segments_out: u64,
    /// RMPP transfers we sent that the receiver acknowledged whole.
    pub rmpp_sent: u64,
    /// RMPP transfers we sent that ended without the last ACK.
    pub rmpp_failed: u64,
}

struct Agent {
    class: u8,
    version: u8,
    methods: Vec<u8>,
}

struct Pending {
    agent: AgentId,
    peer: Gid,
    mad: Box<MadBytes>,
    /// In-order DATA segments of an RMPP response so far.
    segments: Vec<MadBytes>,
}

/// An RMPP transfer we send.
struct Outbound {
    segments: Vec<MadBytes>,
    /// Segments the receiver acknowledged.
    acked: u32,
    /// The last segment the receiver's window lets us send.
    window_last: u32,
    /// The last segment sent.
    sent: u32,
    timeout: Duration,
    retries: u32,
    retries_left: u32,
    deadline: Instant,
}

/// The dispatcher of one port's QP1.
#[derive(Default)]
pub struct Dispatcher {
    agents: BTreeMap<u32, Agent>,
    next_agent: u32,
    next_tid: u32,
    pending: Retries<Pending>,
    outbound: HashMap<(Gid, u64), Outbound>,
    /// RMPP transfers we received whole lately (sender, TID, segments):
    /// their segments resent because the last ACK was lost are ACKed again.
    received_whole: VecDeque<(Gid, u64, u32)>,
    tx: VecDeque<(Gid, Box<MadBytes>)>,
    deliveries: VecDeque<Delivery>,
    stats: GsiStats,
    /// The P_Key index of the last [`REQUEST_PKEYS`] requests received, by
    /// (sender, TID), and their order.
    request_pkeys: HashMap<(Gid, u64), u16>,
    request_order: VecDeque<(Gid, u64)>,
    /// The P_Key index unsolicited MADs of ours go with, by (receiver,
    /// TID) ([`Dispatcher::send_in`]), the last [`REQUEST_PKEYS`] of them.
    send_pkeys: HashMap<(Gid, u64), u16>,
    send_order: VecDeque<(Gid, u64)>,
}

/// Methods that are never answered with a status: they expect no
/// response from us.
fn expects_response(method: u8) -> bool {
    method & 0x80 == 0
        && !matches!(
            Method::from(method),
            Method::Send | Method::Trap | Method::TrapRepress
        )
}

impl Dispatcher {
    /// An empty dispatcher.
    pub fn new() -> Dispatcher {
        Dispatcher {
            next_agent: 1,
            ..Default::default()
        }
    }

    /// Counters so far.
    pub fn stats(&self) -> GsiStats {
        self.stats
    }

    /// Registers an agent for `methods` of `class`/`version` (an empty list
    /// registers for sending requests only).
    ///
    /// # Errors
    /// A method is served by another agent, or is a response method.
    pub fn register(
        &mut self,
        class: u8,
        version: u8,
        methods: &[u8],
    ) -> Result<AgentId, RegisterError> {
        for &m in methods {
            if m & 0x80 != 0 {
                return Err(RegisterError::ResponseMethod(m));
            }
            if let Some((id, _)) = self
                .agents
                .iter()
                .find(|(_, a)| a.class == class && a.version == version && a.methods.contains(&m))
            {
                return Err(RegisterError::Conflict {
                    class,
                    version,
                    method: m,
                    other: *id,
                });
            }
        }
        let id = self.next_agent;
        self.next_agent = self.next_agent.wrapping_add(1).max(1);
        self.agents.insert(
            id,
            Agent {
                class,
                version,
                methods: methods.to_vec(),
            },
        );
        Ok(AgentId(id))
    }

    /// Removes an agent and forgets its outstanding requests.
    pub fn unregister(&mut self, agent: AgentId) {
        self.agents.remove(&agent.0);
        self.pending.retain(|p| p.agent != agent);
        self.deliveries.retain(|d| match d {
            Delivery::Request { agent: a, .. }
            | Delivery::Response { agent: a, .. }
            | Delivery::TimedOut { agent: a, .. } => *a != agent,
        });
    }

    /// Sends request `mad` from `agent` to `peer`, with a fresh
    /// transaction ID written into it; returns the ID. It is sent again
    /// every `timeout`, `retries` more times, until a response comes.
    pub fn send_request(
        &mut self,
        now: Instant,
        agent: AgentId,
        peer: Gid,
        mut mad: MadBytes,
        timeout: Duration,
        retries: u32,
    ) -> u64 {
        self.next_tid = self.next_tid.wrapping_add(1);
        let tid = (u64::from(agent.0) << 32) | u64::from(self.next_tid);
        Mad::new_unchecked(&mut mad[..]).set_tid(tid);
        let mad = Box::new(mad);
        self.tx.push_back((peer, mad.clone()));
        self.pending.insert(
            tid,
            now,
            timeout,
            retries,
            Pending {
                agent,
                peer,
                mad,
                segments: Vec::new(),
            },
        );
        tid
    }

    /// Sends a response too large for one MAD as an RMPP transfer:
    /// `header` holds the MAD's headers (common with the response's TID and
    /// method, RMPP slot, class header; [`rmpp_hdr_len`] of the class
    /// bytes) and `data` the payload. Segments go out as the receiver's
    /// ACKs open the window; unacknowledged ones are resent every
    /// `timeout`, `retries` times.
    ///
    /// # Errors
    /// `header` is shorter than the class's headers.
    pub fn send_rmpp(
        &mut self,
        now: Instant,
        peer: Gid,
        header: &[u8],
        data: &[u8],
        timeout: Duration,
        retries: u32,
    ) -> Result<(), rdma_mad::Error> {
        if header.len() < HEADER_LEN {
            return Err(rdma_mad::Error::Truncated {
                need: HEADER_LEN,
                have: header.len(),
            });
        }
        let hdr_len = rmpp_hdr_len(header[1]);
        let segments = rmpp::segment(header, hdr_len, data, 0x1f)?;
        let tid = u64::from_be_bytes(header[8..16].try_into().expect("8 bytes"));
        let mut o = Outbound {
            segments,
            acked: 0,
            window_last: 1,
            sent: 0,
            timeout,
            retries,
            retries_left: retries,
            deadline: now + timeout,
        };
        self.send_window(peer, &mut o);
        self.outbound.insert((peer, tid), o);
        Ok(())
    }

    fn send_window(&mut self, peer: Gid, o: &mut Outbound) {
        let total = o.segments.len() as u32;
        let last = o.window_last.min(total);
        while o.sent < last {
            o.sent += 1;
            self.stats.rmpp_segments_out += 1;
            self.tx
                .push_back((peer, Box::new(o.segments[o.sent as usize - 1])));
        }
    }

    /// An ACK, STOP or ABORT for a transfer we send.
    fn rmpp_control(&mut self, now: Instant, peer: Gid, tid: u64, h: &RmppHeader) {
        let Some(mut o) = self.outbound.remove(&(peer, tid)) else {
            self.stats.dropped += 1;
            return;
        };
        if h.kind() != RmppType::Ack {
            self.stats.rmpp_failed += 1;
            return;
        }
        let total = o.segments.len() as u32;
        if h.seg_num > o.acked && h.seg_num <= o.sent {
            o.acked = h.seg_num;
            o.retries_left = o.retries;
        }
        o.window_last = o.window_last.max(h.paylen_newwin.min(total));
        if o.acked >= total {
            self.stats.rmpp_sent += 1;
            return;
        }
        o.deadline = now + o.timeout;
        self.send_window(peer, &mut o);
        self.outbound.insert((peer, tid), o);
    }

    /// A DATA segment of the response to our request `tid`.
    fn rmpp_data(&mut self, now: Instant, peer: Gid, tid: u64, mad: MadBytes, h: &RmppHeader) {
        let Some(p) = self.pending.get_mut(tid) else {
            match self
                .received_whole
                .iter()
                .find(|w| w.0 == peer && w.1 == tid)
            {
                Some(&(_, _, total)) => self.tx.push_back((peer, Box::new(rmpp_ack(&mad, total)))),
                None => self.stats.dropped += 1,
            }
            return;
        };
        if h.flags & FLAG_FIRST != 0 && h.seg_num == 1 {
            p.segments.clear();
        }
        let progress = h.seg_num as usize == p.segments.len() + 1;
        if progress {
            p.segments.push(mad);
            self.stats.rmpp_segments_in += 1;
        }
        let have = p.segments.len() as u32;
        let done = p
            .segments
            .last()
            .is_some_and(|m| RmppHeader::parse(m).is_ok_and(|x| x.flags & FLAG_LAST != 0));
        if progress {
            self.pending.rearm(tid, now);
        }
        if have == 0 {
            return;
        }
        self.tx.push_back((peer, Box::new(rmpp_ack(&mad, have))));
        if !done {
            return;
        }
        let Some(sent) = self.pending.remove(tid) else {
            return;
        };
        let p = &sent.req;
        if self.received_whole.len() >= 32 {
            self.received_whole.pop_front();
        }
        self.received_whole.push_back((peer, tid, have));
        let class = p.segments[0][1];
        let segs: Vec<&[u8]> = p.segments.iter().map(|m| &m[..]).collect();
        match rmpp::reassemble(&segs, rmpp_hdr_len(class)) {
            Ok((mut whole, data)) => {
                whole.extend_from_slice(&data);
                self.deliveries.push_back(Delivery::Response {
                    agent: p.agent,
                    tid,
                    mad: whole,
                });
            }
            Err(_) => {
                // Not one transfer after all: ask again from the start.
                self.stats.dropped += 1;
                self.tx.push_back((p.peer, p.mad.clone()));
                let mut sent = sent;
                sent.req.segments.clear();
                self.pending.restore(tid, sent);
            }
        }
    }

    /// Sends `mad` (a response, or a request that wants no answer) as is.
    pub fn send(&mut self, peer: Gid, mad: MadBytes) {
        self.tx.push_back((peer, Box::new(mad)));
    }

    /// [`Dispatcher::send`] in the partition of P_Key table entry
    /// `pkey_index` (a CM message goes in its connection's partition,
    /// IBA 12.6.5, not in QP1's default one: two ports that share only
    /// another partition could not hear each other there).
    pub fn send_in(&mut self, peer: Gid, mad: MadBytes, pkey_index: u16) {
        let tid = u64::from_be_bytes(mad[8..16].try_into().expect("8 bytes"));
        if self.send_pkeys.insert((peer, tid), pkey_index).is_none() {
            self.send_order.push_back((peer, tid));
        }
        while self.send_order.len() > REQUEST_PKEYS {
            if let Some(old) = self.send_order.pop_front() {
                self.send_pkeys.remove(&old);
            }
        }
        self.send(peer, mad);
    }

    /// A MAD arrived from `peer` in the partition of P_Key table entry
    /// `pkey_index` (what the receive completion says): as
    /// [`Dispatcher::handle_mad`], and a request's index is remembered for
    /// its response.
    pub fn handle_mad_in(&mut self, now: Instant, peer: Gid, pkey_index: u16, bytes: &[u8]) {
        if bytes.len() >= HEADER_LEN && bytes[3] & 0x80 == 0 {
            let tid = u64::from_be_bytes(bytes[8..16].try_into().expect("8 bytes"));
            if self.request_pkeys.insert((peer, tid), pkey_index).is_none() {
                self.request_order.push_back((peer, tid));
            }
            while self.request_order.len() > REQUEST_PKEYS {
                if let Some(old) = self.request_order.pop_front() {
                    self.request_pkeys.remove(&old);
                }
            }
        }
        self.handle_mad(now, peer, bytes);
    }

    /// The P_Key index `mad` to `peer` must be sent with: for a response
    /// (R bit, or a TrapRepress) to a request that came through
    /// [`Dispatcher::handle_mad_in`], the request's; `None` otherwise (the
    /// QP's own).
    pub fn pkey_index_for(&self, peer: Gid, mad: &MadBytes) -> Option<u16> {
        let method = mad[3];
        let tid = u64::from_be_bytes(mad[8..16].try_into().expect("8 bytes"));
        if method & 0x80 == 0 && Method::from(method) != Method::TrapRepress {
            return self.send_pkeys.get(&(peer, tid)).copied();
        }
        self.request_pkeys.get(&(peer, tid)).copied()
    }

    /// A MAD arrived from `peer` (in the QP's own partition, as far as the
    /// caller knows: see [`Dispatcher::handle_mad_in`]).
    pub fn handle_mad(&mut self, now: Instant, peer: Gid, bytes: &[u8]) {
        self.stats.received += 1;
        if bytes.len() < HEADER_LEN {
            self.stats.dropped += 1;
            return;
        }
        let mut mad = [0u8; MAD_SIZE];
        let n = bytes.len().min(MAD_SIZE);
        mad[..n].copy_from_slice(&bytes[..n]);
        let (class, version, method) = (mad[1], mad[2], mad[3]);
        if mad[0] != 1 {
            // Bad base version: a status where an answer is expected.
            if expects_response(method) {
                self.status(peer, &mad, StatusCode::BadVersion);
            } else {
                self.stats.dropped += 1;
            }
            return;
        }
        let tid = u64::from_be_bytes(mad[8..16].try_into().expect("8 bytes"));
        if is_rmpp_class(class) {
            if let Ok(h) = RmppHeader::parse(&mad) {
                if h.active()
                    && matches!(h.kind(), RmppType::Ack | RmppType::Stop | RmppType::Abort)
                {
                    self.rmpp_control(now, peer, tid, &h);
                    return;
                }
                if h.active() && h.kind() == RmppType::Data && method & 0x80 != 0 {
                    self.rmpp_data(now, peer, tid, mad, &h);
                    return;
                }
            }
        }
        if method & 0x80 != 0 {
            match self.pending.remove(tid) {
                Some(p) => self.deliveries.push_back(Delivery::Response {
                    agent: p.req.agent,
                    tid,
                    mad: mad.to_vec(),
                }),
                None => self.stats.dropped += 1,
            }
            return;
        }
        let served = self
            .agents
            .iter()
            .find(|(_, a)| a.class == class && a.version == version && a.methods.contains(&method));
        if let Some((id, _)) = served {
            self.deliveries.push_back(Delivery::Request {
                agent: AgentId(*id),
                peer,
                mad: Box::new(mad),
            });
            return;
        }
        if !expects_response(method) {
            self.stats.dropped += 1;
            return;
        }
        let class_known = self
            .agents
            .values()
            .any(|a| a.class == class && a.version == version && !a.methods.is_empty());
        let code = if class_known {
            StatusCode::MethodUnsupported
        } else {
            StatusCode::BadVersion
        };
        self.status(peer, &mad, code);
    }

    fn status(&mut self, peer: Gid, req: &MadBytes, code: StatusCode) {
        let mut status = MadStatus::from_code(code);
        if req[1] == 0x81 {
            // Directed-route SMP: the direction bit says "returning".
            status.0 |= 0x8000;
        }
        self.stats.status_replies += 1;
        self.tx
            .push_back((peer, Box::new(status_reply(req, status))));
    }

    /// The next MAD to send and where.
    pub fn poll_transmit(&mut self) -> Option<(Gid, Box<MadBytes>)> {
        self.tx.pop_front()
    }

    /// The next delivery for an agent.
    pub fn poll_delivery(&mut self) -> Option<Delivery> {
        self.deliveries.pop_front()
    }

    /// When [`Dispatcher::handle_timeout`] is next due.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let a = self.pending.next_deadline();
        a.into_iter()
            .chain(self.outbound.values().map(|o| o.deadline))
            .min()
    }

    /// Retries or ends the requests whose time has come.
    pub fn handle_timeout(&mut self, now: Instant) {
        let (stats, tx, deliveries) = (&mut self.stats, &mut self.tx, &mut self.deliveries);
        self.pending.expire(now, |tid, due| match due {
            Due::Resend(p) => {
                stats.retries += 1;
                tx.push_back((p.peer, p.mad.clone()));
            }
            Due::GaveUp(p) => {
                stats.timeouts += 1;
                deliveries.push_back(Delivery::TimedOut {
                    agent: p.agent,
                    tid,
                });
            }
        });
        let due: Vec<(Gid, u64)> = self
            .outbound
            .iter()
            .filter(|(_, o)| o.deadline <= now)
            .map(|(k, _)| *k)
            .collect();
        for key in due {
            let Some(mut o) = self.outbound.remove(&key) else {
                continue;
            };
            if o.retries_left == 0 {
                self.stats.rmpp_failed += 1;
                continue;
            }
            o.retries_left -= 1;
            o.deadline = now + o.timeout;
            o.sent = o.acked;
            self.stats.retries += 1;
            self.send_window(key.0, &mut o);
            self.outbound.insert(key, o);
        }
    }
}

/// The response to request `req` carrying only `status` (the request's
/// header with the response method; attribute data zeroed).
pub fn status_reply(req: &MadBytes, status: MadStatus) -> MadBytes {
    let mut r = [0u8; MAD_SIZE];
    r[..HEADER_LEN].copy_from_slice(&req[..HEADER_LEN]);
    let mut view = Mad::new_unchecked(&mut r[..]);
    view.set_method(Method::from(req[3]).response());
    view.set_status(status);
    r
}

/// The ACK of DATA segments 1..=`seg` of the transfer `data` belongs to.
fn rmpp_ack(data: &MadBytes, seg: u32) -> MadBytes {
    let mut a = [0u8; MAD_SIZE];
    a[..HEADER_LEN].copy_from_slice(&data[..HEADER_LEN]);
    Mad::new_unchecked(&mut a[..]).set_status(MadStatus::OK);
    RmppHeader {
        version: 1,
        rmpp_type: RmppType::Ack.into(),
        resp_time: 0x1f,
        flags: FLAG_ACTIVE,
        status: 0,
        seg_num: seg,
        paylen_newwin: seg + RMPP_WINDOW,
    }
    .emit(&mut a);
    a
}

/// What [`fuzz_dispatch`] saw.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct FuzzOutcome {
    /// MADs handed in.
    pub inputs: u64,
    /// Status replies sent.
    pub status_replies: u64,
    /// Deliveries to agents.
    pub deliveries: u64,
}

/// The body of the dispatcher fuzz target: `input` is cut into MADs (a
/// length byte, then that many bytes) and fed, between timer ticks, to a
/// dispatcher with a DM, an SA and a CM agent and a few requests in
/// flight. Panics if an answer breaks the rules: a status reply to a
/// response, Send, Trap or TrapRepress, a status reply whose TID or class
/// differs from its request's, or a sent MAD that is not 256 bytes.
#[doc(hidden)]
pub fn fuzz_dispatch(input: &[u8]) -> FuzzOutcome {
    let mut d = Dispatcher::new();
    let peer = Gid([0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
    let dm = d.register(0x06, 1, &[0x01]).expect("fresh");
    let sa = d.register(0x03, 2, &[0x06]).expect("fresh");
    d.register(0x07, 2, &[0x03]).expect("fresh");
    let mut now = Instant::ZERO;
    let t = Duration::from_millis(10);
    let mut req = [0u8; MAD_SIZE];
    req[..4].copy_from_slice(&[1, 0x03, 2, 0x12]);
    let sa_tid = d.send_request(now, sa, peer, req, t, 2);
    req[..4].copy_from_slice(&[1, 0x06, 1, 0x01]);
    let dm_tid = d.send_request(now, dm, peer, req, t, 1);
    let mut out = FuzzOutcome::default();
    let mut rest = input;
    while let Some((&len, tail)) = rest.split_first() {
        let n = (len as usize).min(tail.len());
        let (mut mad, next) = tail.split_at(n);
        rest = next;
        // Steer some inputs onto the requests in flight.
        let mut buf = mad.to_vec();
        if buf.len() >= 16 && len & 0x80 != 0 {
            let tid = if len & 0x40 != 0 { sa_tid } else { dm_tid };
            buf[8..16].copy_from_slice(&tid.to_be_bytes());
            mad = &buf;
        }
        out.inputs += 1;
        // What IBA 13.4.7 asks for this input: a status reply exactly when
        // it is a whole header, a method that wants an answer, and nobody
        // serves it (or its base version is not ours); RMPP ACK/STOP/ABORT
        // go to the RMPP sender instead.
        let want_status = mad.len() >= HEADER_LEN && expects_response(mad[3]) && {
            let (base, class, version, method) = (mad[0], mad[1], mad[2], mad[3]);
            let served = matches!((class, version, method), (6, 1, 1) | (3, 2, 6) | (7, 2, 3));
            let mut whole = [0u8; MAD_SIZE];
            whole[..mad.len().min(MAD_SIZE)].copy_from_slice(&mad[..mad.len().min(MAD_SIZE)]);
            let rmpp_control = is_rmpp_class(class)
                && RmppHeader::parse(&whole)
                    .is_ok_and(|h| h.active() && (2..=4).contains(&h.rmpp_type));
            base != 1 || !(served || rmpp_control)
        };
        d.handle_mad(now, peer, mad);
        let mut statuses = 0;
        while let Some((_, m)) = d.poll_transmit() {
            assert_eq!(m.len(), MAD_SIZE);
            if m[4..6] != [0, 0] && m[3] & 0x80 != 0 && mad.len() >= HEADER_LEN {
                let asked = mad[3];
                assert!(expects_response(asked), "status reply to method {asked:#x}");
                assert_eq!(m[8..16], mad[8..16], "status reply TID");
                assert_eq!(m[1], mad[1], "status reply class");
                statuses += 1;
            }
        }
        assert_eq!(
            statuses,
            u64::from(want_status),
            "status replies to {mad:02x?}"
        );
        out.status_replies += statuses;
        while d.poll_delivery().is_some() {
            out.deliveries += 1;
        }
        now += Duration::from_millis(u64::from(len % 8));
        if d.poll_timeout().is_some_and(|x| x <= now) {
            d.handle_timeout(now);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const DM: u8 = 0x06;

    fn get(class: u8, version: u8, method: u8) -> MadBytes {
        let mut m = [0u8; MAD_SIZE];
        m[0] = 1;
        m[1] = class;
        m[2] = version;
        m[3] = method;
        m[8..16].copy_from_slice(&0x1234u64.to_be_bytes());
        m[16..18].copy_from_slice(&0x0010u16.to_be_bytes());
        m
    }

    fn peer() -> Gid {
        Gid::from_ip("127.0.0.9".parse().unwrap())
    }

    #[test]
    fn registrations_conflict_only_on_the_same_method() {
        let mut d = Dispatcher::new();
        let a = d.register(DM, 1, &[0x01]).unwrap();
        let b = d.register(DM, 1, &[0x02]).unwrap();
        assert_ne!(a, b);
        assert!(matches!(
            d.register(DM, 1, &[0x02, 0x03]),
            Err(RegisterError::Conflict { method: 0x02, .. })
        ));
        assert!(d.register(DM, 2, &[0x01]).is_ok(), "another version");
        assert!(matches!(
            d.register(DM, 1, &[0x81]),
            Err(RegisterError::ResponseMethod(0x81))
        ));
        d.unregister(a);
        assert!(d.register(DM, 1, &[0x01]).is_ok());
    }

    #[test]
    fn requests_reach_their_agent_and_unserved_ones_get_a_status() {
        let mut d = Dispatcher::new();
        let now = Instant::ZERO;
        let dm = d.register(DM, 1, &[0x01]).unwrap();
        d.handle_mad(now, peer(), &get(DM, 1, 0x01));
        match d.poll_delivery() {
            Some(Delivery::Request {
                agent,
                peer: p,
                mad,
            }) => {
                assert_eq!(agent, dm);
                assert_eq!(p, peer());
                assert_eq!(mad[3], 0x01);
            }
            other => panic!("{other:?}"),
        }
        assert!(d.poll_transmit().is_none(), "served: no status reply");
        // Served class, unserved method: method unsupported.
        d.handle_mad(now, peer(), &get(DM, 1, 0x02));
        let (to, r) = d.poll_transmit().expect("a status reply");
        assert_eq!(to, peer());
        assert_eq!(r[3], 0x81, "GetResp for Set");
        assert_eq!(u16::from_be_bytes([r[4], r[5]]), 0x0008);
        assert_eq!(&r[8..16], &0x1234u64.to_be_bytes(), "same TID");
        // Unknown class or version: bad version.
        d.handle_mad(now, peer(), &get(0x04, 1, 0x01));
        let (_, r) = d.poll_transmit().unwrap();
        assert_eq!(u16::from_be_bytes([r[4], r[5]]), 0x0004);
        d.handle_mad(now, peer(), &get(DM, 7, 0x01));
        let (_, r) = d.poll_transmit().unwrap();
        assert_eq!(u16::from_be_bytes([r[4], r[5]]), 0x0004);
        // Never answered: responses, Send, Trap, TrapRepress, junk.
        for m in [0x81, 0x03, 0x05, 0x07] {
            d.handle_mad(now, peer(), &get(0x04, 1, m));
        }
        d.handle_mad(now, peer(), &[1, 2, 3]);
        assert!(d.poll_transmit().is_none());
        assert!(d.poll_delivery().is_none());
        // A base version we do not speak: bad version, even for a served class.
        let mut bad_base = get(DM, 1, 0x01);
        bad_base[0] = 2;
        d.handle_mad(now, peer(), &bad_base);
        let (_, r) = d.poll_transmit().unwrap();
        assert_eq!(u16::from_be_bytes([r[4], r[5]]), 0x0004);
        // A directed-route SMP's status carries the direction bit.
        d.handle_mad(now, peer(), &get(0x81, 1, 0x01));
        let (_, r) = d.poll_transmit().unwrap();
        assert_eq!(u16::from_be_bytes([r[4], r[5]]), 0x8004);
        assert!(d.poll_delivery().is_none());
        assert_eq!(d.stats().status_replies, 5);
        assert_eq!(d.stats().dropped, 5);
    }

    #[test]
    fn responses_go_back_in_the_requests_partition() {
        let mut d = Dispatcher::new();
        let now = Instant::ZERO;
        d.register(DM, 1, &[0x01]).unwrap();
        let other = Gid::from_ip("127.0.0.10".parse().unwrap());
        // A Get in the partition of entry 2: its answer (same TID, R bit)
        // goes there, to that sender only.
        d.handle_mad_in(now, peer(), 2, &get(DM, 1, 0x01));
        let Some(Delivery::Request { mad, .. }) = d.poll_delivery() else {
            panic!("not delivered");
        };
        let mut resp = *mad;
        resp[3] = 0x81;
        assert_eq!(d.pkey_index_for(peer(), &resp), Some(2));
        assert_eq!(d.pkey_index_for(other, &resp), None);
        // A request of ours with that TID is no answer.
        assert_eq!(d.pkey_index_for(peer(), &mad), None);
        // A status reply to an unserved method, in entry 1's partition.
        d.handle_mad_in(now, other, 1, &get(DM, 1, 0x02));
        let (to, r) = d.poll_transmit().unwrap();
        assert_eq!((to, d.pkey_index_for(to, &r)), (other, Some(1)));
        // Only the last REQUEST_PKEYS requests are remembered.
        for i in 0..REQUEST_PKEYS as u64 {
            let mut m = get(DM, 1, 0x01);
            m[8..16].copy_from_slice(&(0x10_0000 + i).to_be_bytes());
            d.handle_mad_in(now, peer(), 3, &m);
        }
        assert_eq!(d.pkey_index_for(other, &r), None, "forgotten");
    }

    #[test]
    fn requests_retry_then_time_out_and_responses_route_by_tid() {
        let mut d = Dispatcher::new();
        let mut now = Instant::ZERO;
        let a = d.register(DM, 1, &[]).unwrap();
        let b = d.register(DM, 1, &[]).unwrap();
        let t = Duration::from_millis(100);
        let ta = d.send_request(now, a, peer(), get(DM, 1, 0x01), t, 2);
        let tb = d.send_request(now, b, peer(), get(DM, 1, 0x01), t, 0);
        assert_eq!(ta >> 32, u64::from(a.0), "agent in the high bits");
        assert_ne!(ta, tb);
        let (_, first) = d.poll_transmit().unwrap();
        assert_eq!(&first[8..16], &ta.to_be_bytes());
        d.poll_transmit().unwrap();
        // B times out at once (no retries); A is sent twice more, then ends.
        let mut sends = 0;
        let mut ends = Vec::new();
        for _ in 0..10 {
            now = d.poll_timeout().expect("a timer");
            d.handle_timeout(now);
            while d.poll_transmit().is_some() {
                sends += 1;
            }
            while let Some(x) = d.poll_delivery() {
                ends.push(x);
            }
            if d.poll_timeout().is_none() {
                break;
            }
        }
        assert_eq!(sends, 2);
        assert_eq!(
            ends,
            vec![
                Delivery::TimedOut { agent: b, tid: tb },
                Delivery::TimedOut { agent: a, tid: ta }
            ]
        );
        // A response finds its requester; a late or unknown one is dropped.
        let tc = d.send_request(now, b, peer(), get(DM, 1, 0x01), t, 3);
        let mut resp = get(DM, 1, 0x81);
        resp[8..16].copy_from_slice(&tc.to_be_bytes());
        d.handle_mad(now, peer(), &resp);
        assert!(
            matches!(d.poll_delivery(), Some(Delivery::Response { agent, tid, .. }) if agent == b && tid == tc)
        );
        d.handle_mad(now, peer(), &resp);
        assert!(d.poll_delivery().is_none());
        assert_eq!(d.poll_timeout(), None, "answered: no timer left");
    }

    /// Moves MADs between two dispatchers until both are quiet, dropping
    /// every `drop_every`-th one (0: none); runs timers when nothing moves.
    fn shuttle(a: &mut Dispatcher, b: &mut Dispatcher, now: &mut Instant, drop_every: u32) {
        let (ga, gb) = (peer(), Gid::from_ip("127.0.0.10".parse().unwrap()));
        let mut n = 0u32;
        for _ in 0..10_000 {
            let mut moved = false;
            while let Some((_, m)) = a.poll_transmit() {
                moved = true;
                n += 1;
                if drop_every == 0 || !n.is_multiple_of(drop_every) {
                    b.handle_mad(*now, ga, &m[..]);
                }
            }
            while let Some((_, m)) = b.poll_transmit() {
                moved = true;
                n += 1;
                if drop_every == 0 || !n.is_multiple_of(drop_every) {
                    a.handle_mad(*now, gb, &m[..]);
                }
            }
            if moved {
                continue;
            }
            let next = [a.poll_timeout(), b.poll_timeout()]
                .into_iter()
                .flatten()
                .min();
            let Some(t) = next else { return };
            *now = t;
            a.handle_timeout(t);
            b.handle_timeout(t);
        }
        panic!("no quiet after 10000 rounds");
    }

    #[test]
    fn rmpp_transfers_reassemble_with_and_without_loss() {
        for drop_every in [0, 5] {
            let mut a = Dispatcher::new();
            let mut b = Dispatcher::new();
            let mut now = Instant::ZERO;
            let client = a.register(0x03, 2, &[]).unwrap();
            let server = b.register(0x03, 2, &[0x12]).unwrap();
            let t = Duration::from_millis(50);
            let mut q = get(0x03, 2, 0x12);
            q[24..36].fill(0);
            let tid = a.send_request(
                now,
                client,
                Gid::from_ip("127.0.0.10".parse().unwrap()),
                q,
                t,
                20,
            );
            // 30 records of 64 bytes: 1920 bytes, 10 segments of 200.
            let data: Vec<u8> = (0..1920u32).map(|i| (i * 7 + i / 256) as u8).collect();
            let mut answered = 0;
            let mut got = None;
            for _ in 0..50 {
                let ga = peer();
                while let Some((_, m)) = a.poll_transmit() {
                    b.handle_mad(now, ga, &m[..]);
                }
                while let Some(Delivery::Request {
                    agent,
                    peer: p,
                    mad,
                }) = b.poll_delivery()
                {
                    assert_eq!(agent, server);
                    let mut h = status_reply(&mad, MadStatus::OK);
                    h[44..46].copy_from_slice(&8u16.to_be_bytes());
                    b.send_rmpp(now, p, &h[..56], &data, t, 5).unwrap();
                    answered += 1;
                }
                shuttle(&mut a, &mut b, &mut now, drop_every);
                if let Some(d) = a.poll_delivery() {
                    got = Some(d);
                    break;
                }
            }
            match got {
                Some(Delivery::Response {
                    agent,
                    tid: t2,
                    mad,
                }) => {
                    assert_eq!((agent, t2), (client, tid));
                    assert_eq!(mad.len(), 56 + 1920);
                    assert_eq!(&mad[56..], &data[..], "drop_every {drop_every}");
                    assert_eq!(mad[3], 0x92);
                    assert_eq!(u16::from_be_bytes([mad[44], mad[45]]), 8);
                }
                other => panic!("drop_every {drop_every}: {other:?}"),
            }
            assert!(answered >= 1);
            assert!(a.stats().rmpp_segments_in >= 10);
            if drop_every == 0 {
                assert_eq!(b.stats().rmpp_segments_out, 10, "no resends without loss");
                assert_eq!(b.stats().rmpp_sent, 1);
                assert_eq!(answered, 1);
            } else {
                assert!(b.stats().rmpp_segments_out > 10, "losses were resent");
            }
            // The sender saw the end of the transfer it finished (a lost
            // last ACK is sent again for the resent segment).
            shuttle(&mut a, &mut b, &mut now, drop_every);
            assert_eq!(b.stats().rmpp_failed, 0);
            assert!(b.stats().rmpp_sent >= 1);
            assert_eq!(a.poll_timeout(), None);
        }
    }

    #[test]
    fn fuzz_body_holds_on_deterministic_inputs() {
        let mut rng = rdma_sim::Rng::new(0x5eed);
        let mut total = FuzzOutcome::default();
        for i in 0..3000u32 {
            let len = rng.below(1200) as usize;
            let mut buf = vec![0u8; len];
            rng.fill(&mut buf);
            // Make some inputs look like MADs: base version 1, a known class.
            let mut k = 0;
            while k + 4 < buf.len() {
                let l = buf[k] as usize;
                if i % 2 == 0 && k + 4 < buf.len() {
                    buf[k + 1] = 1;
                    buf[k + 2] = [0x03, 0x06, 0x07, 0x04, 0x81][l % 5];
                }
                k += l + 1;
            }
            let o = fuzz_dispatch(&buf);
            total.inputs += o.inputs;
            total.status_replies += o.status_replies;
            total.deliveries += o.deliveries;
        }
        assert!(total.inputs > 10_000, "{total:?}");
        assert!(total.status_replies > 100, "{total:?}");
        assert!(total.deliveries > 10, "{total:?}");
    }
}
