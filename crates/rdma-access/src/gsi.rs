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
//! agent has the class and version, "method unsupported" when the class is
//! served but not the method. Responses, Send, Trap and TrapRepress are
//! never answered. MADs with a base version other than 1, shorter than a
//! header, or responses nobody waits for are dropped and counted.
//!
//! The CM class is not routed here: the port's CM state machine reads it
//! first (see [`crate::CmAgent`]).

use rdma_mad::mad::{MadStatus, Method, StatusCode, HEADER_LEN, MAD_SIZE};
use rdma_types::{Duration, Gid, Instant};
use std::collections::{BTreeMap, HashMap, VecDeque};

/// A 256-byte MAD.
pub type MadBytes = [u8; MAD_SIZE];

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
    /// The response to `tid`.
    Response {
        /// The requesting agent.
        agent: AgentId,
        /// Transaction ID.
        tid: u64,
        /// The MAD.
        mad: Box<MadBytes>,
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
    timeout: Duration,
    retries_left: u32,
    deadline: Instant,
}

/// The dispatcher of one port's QP1.
#[derive(Default)]
pub struct Dispatcher {
    agents: BTreeMap<u32, Agent>,
    next_agent: u32,
    next_tid: u32,
    pending: HashMap<u64, Pending>,
    tx: VecDeque<(Gid, Box<MadBytes>)>,
    deliveries: VecDeque<Delivery>,
    stats: GsiStats,
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
        self.pending.retain(|_, p| p.agent != agent);
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
        mad[8..16].copy_from_slice(&tid.to_be_bytes());
        let mad = Box::new(mad);
        self.tx.push_back((peer, mad.clone()));
        self.pending.insert(
            tid,
            Pending {
                agent,
                peer,
                mad,
                timeout,
                retries_left: retries,
                deadline: now + timeout,
            },
        );
        tid
    }

    /// Sends `mad` (a response, or a request that wants no answer) as is.
    pub fn send(&mut self, peer: Gid, mad: MadBytes) {
        self.tx.push_back((peer, Box::new(mad)));
    }

    /// A MAD arrived from `peer`.
    pub fn handle_mad(&mut self, _now: Instant, peer: Gid, bytes: &[u8]) {
        self.stats.received += 1;
        if bytes.len() < HEADER_LEN || bytes[0] != 1 {
            self.stats.dropped += 1;
            return;
        }
        let mut mad = [0u8; MAD_SIZE];
        let n = bytes.len().min(MAD_SIZE);
        mad[..n].copy_from_slice(&bytes[..n]);
        let (class, version, method) = (mad[1], mad[2], mad[3]);
        let tid = u64::from_be_bytes(mad[8..16].try_into().expect("8 bytes"));
        if method & 0x80 != 0 {
            match self.pending.remove(&tid) {
                Some(p) => self.deliveries.push_back(Delivery::Response {
                    agent: p.agent,
                    tid,
                    mad: Box::new(mad),
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
        self.stats.status_replies += 1;
        self.tx.push_back((
            peer,
            Box::new(status_reply(&mad, MadStatus::from_code(code))),
        ));
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
        self.pending.values().map(|p| p.deadline).min()
    }

    /// Retries or ends the requests whose time has come.
    pub fn handle_timeout(&mut self, now: Instant) {
        let due: Vec<u64> = self
            .pending
            .iter()
            .filter(|(_, p)| p.deadline <= now)
            .map(|(t, _)| *t)
            .collect();
        for tid in due {
            let Some(p) = self.pending.get_mut(&tid) else {
                continue;
            };
            if p.retries_left > 0 {
                p.retries_left -= 1;
                p.deadline = now + p.timeout;
                self.stats.retries += 1;
                self.tx.push_back((p.peer, p.mad.clone()));
            } else {
                let agent = p.agent;
                self.pending.remove(&tid);
                self.stats.timeouts += 1;
                self.deliveries.push_back(Delivery::TimedOut { agent, tid });
            }
        }
    }
}

/// The response to request `req` carrying only `status` (the request's
/// header with the response method; attribute data zeroed).
pub fn status_reply(req: &MadBytes, status: MadStatus) -> MadBytes {
    let mut r = [0u8; MAD_SIZE];
    r[..HEADER_LEN].copy_from_slice(&req[..HEADER_LEN]);
    r[3] = u8::from(Method::from(req[3]).response());
    r[4..6].copy_from_slice(&status.0.to_be_bytes());
    r
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
        let mut bad_base = get(DM, 1, 0x01);
        bad_base[0] = 2;
        d.handle_mad(now, peer(), &bad_base);
        assert!(d.poll_transmit().is_none());
        assert!(d.poll_delivery().is_none());
        assert_eq!(d.stats().status_replies, 3);
        assert_eq!(d.stats().dropped, 6);
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
}
