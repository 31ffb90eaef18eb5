// Body of the `cm_login` fuzz target, shared with the deterministic test
// `tests/cm_login_fuzz.rs` (included with `include!`).
//
// The target's CM login path with every piece real but the wire: a sans-IO
// `rdma_cm::Cm` as the target port's passive side, its events routed as
// the CM agent routes them (`rdma_access::hook_for`), the login service's
// bookkeeping (`srp_target::cm::Logins`) and a `TargetPort` over the
// in-process loopback provider, driven by the caller on a virtual clock
// (`PortDrive::Caller`). Four initiator ports send any sequence of REQs
// (SRP logins, well formed or not, in any partition), MRAs, REJs, REPs,
// RTUs, DREQs and DREPs with arbitrary private data; time passes; the
// target closes channels by itself (disable, logout). After every step:
//
// - channels held == established + pending: every channel the port holds
//   that is not closing is carried by exactly one CM connection, in REP
//   sent while the channel is pending and established while it is live;
//   every CM connection in those states carries one; nothing is carried
//   by a connection the CM has in another state or no longer has;
// - the pending logins are within `max_pending_logins`, and each
//   initiator port's within `max_pending_per_initiator`.
//
// At the end every timer fires: no login is left pending, and only the
// connections that are established hold channels.

use rdma_access::{hook_for, Call, QpParams};
use rdma_cm::{Cm, CmConfig, CmEvent, CmMsg, ConnId as CmConn, ConnState, MsgKind, RejReason};
use rdma_cm::{ReqInfo, Timing};
use rdma_types::TimeoutExp;
use rdma_types::{CmRetries, Duration, Gid, Guid, Instant, Lid, Mtu, Pkey, PortNum, Psn, Qpn};
use srp::target::{LoginForm, TargetConfig};
use srp::wire::{BufFormats, LoginReq, LoginReqFlags, PortId, TLogoutReason, Tag};
use srp_target::cm::{Answer, LoginRequest, Logins};
use srp_target::{ChannelPhase, PeerQp, PortDrive, PortOptions, TargetPort};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// The service the target listens on (its IOC GUID, as ib_srpt).
const SERVICE: u64 = 0x0002_c903_00ab_cdef;
const TARGET_GUID: u64 = 0x7a;
/// The target port's P_Key table: the default partition, a full member
/// of 0x0010, a limited one of 0x0020.
const PKEYS: [Pkey; 3] = [Pkey(0xffff), Pkey(0x8010), Pkey(0x0020)];

struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn u8(&mut self) -> u8 {
        let (b, rest) = self.0.split_first().map_or((0, &[][..]), |(b, r)| (*b, r));
        self.0 = rest;
        b
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }
    fn exp(&mut self) -> TimeoutExp {
        TimeoutExp::from_bits(self.u8())
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        let n = n.min(self.0.len());
        let (b, rest) = self.0.split_at(n);
        self.0 = rest;
        b.to_vec()
    }
}

fn target_port_id() -> PortId {
    PortId(*b"\x00\x00\x00\x00\x00\x00\x00\x7a\x00\x02\xc9\x03\x00\xab\xcd\xef")
}

/// The initiator port IDs the peers log in with: three names shared among
/// them (so logins of one port come from several GIDs), or any.
fn initiator_id(inp: &mut Input) -> PortId {
    let sel = inp.u8();
    let mut id = [0u8; 16];
    if sel < 240 {
        id[15] = 1 + sel % 3;
    } else {
        let b = inp.bytes(16);
        id[..b.len()].copy_from_slice(&b);
    }
    PortId(id)
}

/// A login request's private data: an SRP_LOGIN_REQ built from the input
/// (any flags, sizes and formats), sometimes with bytes overwritten, cut
/// short or extended, or any bytes at all.
fn login_data(inp: &mut Input) -> Vec<u8> {
    let shape = inp.u8();
    if shape < 16 {
        let n = usize::from(inp.u8() % 96);
        return inp.bytes(n);
    }
    let req = LoginReq {
        tag: Tag(u64::from(inp.u8())),
        req_it_iu_len: [64, 68, 4148, 8260, 9000, u32::from(inp.u16())][usize::from(inp.u8() % 6)],
        req_buf_fmt: BufFormats(u16::from(inp.u8() & 0x6)),
        flags: LoginReqFlags(inp.u8() & 0x83),
        imm_data_offset: [0, 68, 80][usize::from(inp.u8() % 3)],
        initiator_port_id: initiator_id(inp),
        target_port_id: if inp.u8() < 240 {
            target_port_id()
        } else {
            PortId([inp.u8(); 16])
        },
    };
    let mut b = vec![0u8; req.buffer_len()];
    req.emit(&mut b).expect("sized by buffer_len");
    match shape % 8 {
        0 => {
            let at = usize::from(inp.u8()) % b.len();
            b[at] = inp.u8();
        }
        1 => b.truncate(usize::from(inp.u8()) % b.len()),
        2 => {
            let n = usize::from(inp.u8() % 32);
            b.extend(inp.bytes(n));
        }
        _ => {}
    }
    b
}

/// What a run did, for the deterministic test to check it went deep.
#[derive(Debug, Default, Clone, Copy)]
pub struct LoginRun {
    pub steps: usize,
    pub accepted: usize,
    pub refused: usize,
    pub established: usize,
    pub ended_by_cm: usize,
    pub closed_by_target: usize,
    pub most_pending: usize,
}

struct Harness {
    cm: Cm<u8>,
    logins: Arc<Logins>,
    target: Arc<TargetPort>,
    /// CM connections whose channel the target closed: the agent
    /// disconnects them.
    closed: Arc<Mutex<Vec<u32>>>,
    /// The target's clock at the virtual time zero.
    base: std::time::Instant,
    now: Instant,
    opts: PortOptions,
    /// REQ responder resources each peer announces (what the REP's
    /// initiator depth follows).
    depth: [u8; 4],
    run: LoginRun,
}

fn peer_gid(peer: u8) -> Gid {
    Gid::from_prefix_guid(0xfe80_0000_0000_0000, Guid(0x100 + u64::from(peer)))
}

impl Harness {
    /// A REQ the CM delivered: refused if the port's P_Key table cannot
    /// match its partition (as the agent does), else the login service
    /// answers it.
    fn request(&mut self, conn: CmConn, peer: u8, req: ReqInfo) {
        if !PKEYS.iter().any(|k| k.matches(req.pkey)) {
            self.cm.reject(conn, RejReason::INVALID_GID, Vec::new());
            return;
        }
        let rr = self.depth[usize::from(peer % 4)];
        let login = LoginRequest {
            data: req.private_data,
            form: LoginForm::IbCm,
            src: format!("peer {peer}"),
            peer: PeerQp {
                qpn: req.qpn,
                psn: req.psn,
                gid: peer_gid(peer),
                lid: Lid(0),
                mtu: Mtu::Mtu1024,
                initiator_depth: QpParams::DEFAULT.initiator_depth.min(rr),
                ack_timeout: req.timing.local_ack_timeout().value(),
                local_psn: None,
            },
            pkey: req.pkey,
        };
        let (now, cm, run) = (self.now, &mut self.cm, &mut self.run);
        self.logins.request(conn.0, login, |answer| match answer {
            Answer::Accept { local, rsp } => {
                run.accepted += 1;
                assert!(cm.accept(now, conn, local.qpn, local.psn, rsp));
            }
            Answer::Reject { rej } => {
                run.refused += 1;
                assert!(cm.reject(conn, RejReason::CONSUMER_DEFINED, rej));
            }
        });
    }

    /// Everything the step set off, until nothing moves: the CM's events
    /// routed as the agent routes them, the port's completions and timers,
    /// the CM disconnecting what the target closed.
    fn settle(&mut self) {
        loop {
            let mut moved = false;
            while self.cm.poll_transmit().is_some() {
                moved = true;
            }
            while let Some(ev) = self.cm.poll_event() {
                moved = true;
                if let CmEvent::Request { conn, peer, req } = ev {
                    self.request(conn, peer, req);
                    continue;
                }
                match hook_for(&ev, false) {
                    Some(Call::Established(c)) => {
                        self.run.established += 1;
                        self.logins.cm_established(c.0);
                    }
                    Some(Call::Ended(c)) => {
                        self.run.ended_by_cm += 1;
                        self.logins.cm_ended(c.0);
                    }
                    None => {}
                }
            }
            self.target
                .poll_at(self.base + std::time::Duration::from_micros(self.now.total_micros()));
            let closed = std::mem::take(&mut *self.closed.lock().unwrap());
            for cm in closed {
                moved = true;
                self.run.closed_by_target += 1;
                self.cm.disconnect(self.now, CmConn(cm));
            }
            if !moved {
                return;
            }
        }
    }

    fn advance(&mut self, by: Duration) {
        self.now += by;
        self.cm.handle_timeout(self.now);
    }

    /// The invariants, at rest.
    fn check(&mut self) {
        let sessions = self.target.sessions();
        let carried = self.logins.carried();
        let states: HashMap<u32, ConnState> =
            self.cm.connections().map(|(c, s)| (c.0, s)).collect();
        let pending: Vec<&str> = sessions
            .iter()
            .filter(|s| s.phase == ChannelPhase::Pending)
            .map(|s| s.initiator.as_str())
            .collect();
        self.run.most_pending = self.run.most_pending.max(pending.len());
        assert!(
            pending.len() <= self.opts.max_pending_logins,
            "{} logins pending, max_pending_logins {}",
            pending.len(),
            self.opts.max_pending_logins
        );
        for i in &pending {
            let n = pending.iter().filter(|j| *j == i).count();
            assert!(
                n <= self.opts.max_pending_per_initiator,
                "{n} logins of {i} pending, max_pending_per_initiator {}",
                self.opts.max_pending_per_initiator
            );
        }
        for s in &sessions {
            let carriers: Vec<u32> = carried
                .iter()
                .filter(|(_, c)| *c == s.conn)
                .map(|(cm, _)| *cm)
                .collect();
            let want = match s.phase {
                ChannelPhase::Pending => Some(ConnState::RepSent),
                ChannelPhase::Live => Some(ConnState::Established),
                ChannelPhase::Closing => None,
            };
            match want {
                None => assert!(
                    carriers.is_empty(),
                    "closing channel {:?} still carried by CM connection {carriers:?}",
                    s.conn
                ),
                Some(state) => {
                    assert_eq!(
                        carriers.len(),
                        1,
                        "{:?} channel {:?} carried by CM connections {carriers:?}",
                        s.phase,
                        s.conn
                    );
                    assert_eq!(
                        states.get(&carriers[0]),
                        Some(&state),
                        "{:?} channel {:?} on CM connection {}",
                        s.phase,
                        s.conn,
                        carriers[0]
                    );
                }
            }
        }
        for (cm, conn) in &carried {
            assert!(
                sessions
                    .iter()
                    .any(|s| s.conn == *conn && s.phase != ChannelPhase::Closing),
                "CM connection {cm} carries channel {conn:?}, which the target no longer holds"
            );
        }
        for (cm, state) in &states {
            if matches!(state, ConnState::RepSent | ConnState::Established) {
                assert!(
                    carried.iter().any(|(c, _)| c == cm),
                    "CM connection {cm} is {state:?} with no channel"
                );
            }
        }
    }
}

/// Runs one input; returns what it did.
pub fn run_cm_login(data: &[u8]) -> LoginRun {
    let mut inp = Input(data);
    let fabric = rnic::loopback::Fabric::new();
    fabric
        .add_ca(rnic::loopback::CaConfig::simple(TARGET_GUID, 1))
        .expect("a fresh fabric takes the CA");
    fabric
        .set_pkeys(Guid(TARGET_GUID), PortNum(1), PKEYS.to_vec())
        .expect("the CA has port 1");
    let provider: Arc<dyn verbs::Provider> = fabric;
    let mut cfg = TargetConfig::new(target_port_id(), "fuzz");
    cfg.srq_size = 16;
    cfg.sq_size = 4;
    cfg.max_rdma_size = 4096;
    cfg.max_table_len = 4096;
    cfg.max_credits = 8;
    cfg.max_channels = 1 + usize::from(inp.u8() % 8);
    cfg.max_channels_per_nexus = 1 + usize::from(inp.u8() % 3);
    cfg.multichannel = inp.u8() & 1 == 1;
    let opts = PortOptions {
        workers: 1,
        chunks: 2,
        login_timeout: std::time::Duration::from_millis(100 * (1 + u64::from(inp.u8() % 50))),
        max_pending_logins: 1 + usize::from(inp.u8() % 4),
        max_pending_per_initiator: 1 + usize::from(inp.u8() % 3),
        keepalive: None,
        drive: PortDrive::Caller,
        ..PortOptions::default()
    };
    let scsi = Arc::new(scsi::Target::new());
    let target = Arc::new(
        TargetPort::start(provider, Guid(TARGET_GUID), cfg, scsi, opts.clone())
            .expect("the target port starts"),
    );
    let logins = Arc::new(Logins::new(target.clone(), |_| {}));
    let closed = Arc::new(Mutex::new(Vec::new()));
    {
        let (logins, closed) = (logins.clone(), closed.clone());
        target.on_disconnect(move |conn, why| {
            if let Some(cm) = logins.target_closed(conn, why) {
                closed.lock().unwrap().push(cm);
            }
        });
    }
    let cm_cfg = CmConfig {
        response_timeout: inp.exp(),
        max_retries: CmRetries::from_bits(inp.u8() % 4),
        timewait: Duration::from_millis(u64::from(inp.u8()) * 10),
        min_timeout: Duration::from_millis(1),
        max_timeout: Duration::from_secs(4),
        ..CmConfig::default()
    };
    let mut cm: Cm<u8> = Cm::new(cm_cfg, 1);
    cm.listen(SERVICE);
    let mut h = Harness {
        cm,
        logins,
        target,
        closed,
        base: std::time::Instant::now(),
        now: Instant::ZERO,
        opts,
        depth: [inp.u8() % 5, 16, 4, 1],
        run: LoginRun::default(),
    };
    h.settle();
    let mut last_req: Option<(u8, CmMsg)> = None;
    while !inp.0.is_empty() && h.run.steps < 300 {
        h.run.steps += 1;
        let peer = inp.u8() % 4;
        // Most messages name a connection the CM has, as its peer would.
        let ids: Vec<u32> = h.cm.connections().map(|(c, _)| c.0).collect();
        let pick = inp.u8();
        let conn = match ids.get(usize::from(pick) % ids.len().max(1)) {
            Some(id) if pick < 224 => *id,
            _ => u32::from(pick),
        };
        let local = u32::from(inp.u8() % 16) + 16 * u32::from(peer);
        let msg = match inp.u8() % 12 {
            0..=2 => CmMsg::Req {
                local_comm_id: local,
                service_id: if inp.u8() < 240 { SERVICE } else { 7 },
                qpn: Qpn::from_bits(0x100 + u32::from(inp.u8() % 8)),
                psn: Psn::new(inp.u32()),
                pkey: [
                    Pkey(0xffff),
                    Pkey(0x8010),
                    Pkey(0x0020),
                    Pkey(0x7fff),
                    Pkey(0x8030),
                ][usize::from(inp.u8() % 5)],
                timing: Timing {
                    packet_life_time: inp.exp(),
                    local_cm_response_timeout: inp.exp(),
                    remote_cm_response_timeout: inp.exp(),
                },
                private_data: login_data(&mut inp),
            },
            3 => CmMsg::Rtu {
                local_comm_id: local,
                remote_comm_id: conn,
            },
            4 => CmMsg::Rej {
                local_comm_id: local,
                remote_comm_id: conn,
                msg: [MsgKind::Rep, MsgKind::Req, MsgKind::Other][usize::from(inp.u8() % 3)],
                reason: RejReason(u16::from(inp.u8())),
                private_data: {
                    let n = usize::from(inp.u8() % 32);
                    inp.bytes(n)
                },
            },
            5 => CmMsg::Dreq {
                local_comm_id: local,
                remote_comm_id: conn,
            },
            6 => CmMsg::Drep {
                local_comm_id: local,
                remote_comm_id: conn,
            },
            7 => CmMsg::Mra {
                local_comm_id: local,
                remote_comm_id: conn,
                msg: MsgKind::Rep,
                service_timeout: inp.exp(),
            },
            8 => CmMsg::Rep {
                local_comm_id: local,
                remote_comm_id: conn,
                qpn: Qpn::from_bits(inp.u32()),
                psn: Psn::new(0),
                private_data: Vec::new(),
            },
            9 => {
                h.advance(Duration::from_millis(u64::from(inp.u16() % 20_000)));
                h.settle();
                h.check();
                continue;
            }
            10 => {
                match inp.u8() % 3 {
                    0 => {
                        h.target.set_enabled(false);
                        h.settle();
                        h.target.set_enabled(true);
                    }
                    1 => h.target.logout_all(TLogoutReason::NoReason),
                    _ => h.depth[usize::from(peer)] = inp.u8() % 17,
                }
                h.settle();
                h.check();
                continue;
            }
            _ => match last_req.clone() {
                // The same REQ again (a resend).
                Some((p, m)) => {
                    h.cm.handle_msg(h.now, p, m);
                    h.settle();
                    h.check();
                    continue;
                }
                None => continue,
            },
        };
        if matches!(msg, CmMsg::Req { .. }) {
            last_req = Some((peer, msg.clone()));
        }
        h.cm.handle_msg(h.now, peer, msg);
        h.settle();
        h.check();
    }
    // Every timer: the CM's resends and timeouts, then the port's login
    // timeout. Only established connections keep their channels.
    let mut fired = 0;
    while let Some(t) = h.cm.poll_timeout() {
        fired += 1;
        assert!(fired < 10_000, "the CM's timers never end");
        let at = t.max(h.now + Duration::from_millis(1));
        h.advance(at - h.now);
        h.settle();
        h.check();
    }
    h.advance(Duration::from_std(h.opts.login_timeout));
    h.settle();
    h.check();
    let sessions = h.target.sessions();
    assert!(
        sessions.iter().all(|s| s.phase == ChannelPhase::Live),
        "after every timeout: {:?}",
        sessions
            .iter()
            .map(|s| (s.conn, s.phase))
            .collect::<Vec<_>>()
    );
    // The hook holds the service, which holds the port: let go of both.
    h.target.on_disconnect(|_, _| {});
    h.target.stop();
    h.run
}
