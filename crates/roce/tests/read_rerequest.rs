//! READ re-requests against a responder that, like Linux rxe, answers only
//! the re-requests it can match to its responder resources (issue 22,
//! item 6).
//!
//! The requester is ours, driven as an SRP target drives it: an RDMA READ
//! fetches each command's 64 KiB of data-out, and the command's response
//! (a SEND) is posted once that READ completes, so SENDs sit between
//! READs in the send queue and their ACKs pass READs still waiting for
//! responses. The responder is a model of rxe's (`rxe_resp.c`): new
//! requests in PSN order, one sequence NAK per gap, a duplicate SEND
//! ACKed with the last PSN it acknowledged, and a duplicate READ answered
//! only when its PSN falls in a responder resource and its VA and length
//! lie inside that resource's remaining range -- which each answered
//! re-request moves to its own VA, so a re-request that goes back before
//! an earlier one is dropped without an answer.
//!
//! What the requester must do: ask a READ again from its first missing
//! response PSN, with the VA and length of what is missing, once per sign
//! of the loss (a sequence NAK, a response past the gap, an ACK past the
//! READ, a timeout) -- never again from the READ's start once responses
//! are in, and not once per ACK or duplicate ACK.
//!
//! Everything runs on a virtual clock over `rdma-sim` links with a line
//! rate, so packets arrive one by one as they would from a NIC.

use rdma_sim::{FaultConfig, FaultInjector, Payload as SimPayload, Rng};
use rdma_types::{Duration, Instant, Lkey, Mtu, Pkey, Psn, Qpn, Rkey, WcOpcode, WcStatus};
use rdma_wire::{AethRepr, CreditCount, NakCode, Opcode, RethRepr, Syndrome};
use roce::{
    Completion, FlatMemory, Memory, MemoryError, Packet, Qp, QpConfig, RemoteAccess, SendOp,
    SendWqe, Sge,
};
use std::collections::VecDeque;

/// Bytes of data-out per command: one 64 KiB READ, 16 packets at 4 KiB.
const CMD_LEN: u64 = 64 * 1024;
const PMTU: u64 = 4096;
const KEY: u32 = 7;
const REQUESTER_QPN: u32 = 0x11;
const RESPONDER_QPN: u32 = 0x22;

// ------------------------------------------------------------ requester memory

/// The requester's memory, recording how far each command's buffer has
/// been filled by READ responses the requester accepted (it accepts them
/// in order only, so the high-water mark is what it holds).
struct Recorded {
    mem: FlatMemory,
    filled: Vec<u64>,
}

impl Recorded {
    fn new(cmds: usize) -> Recorded {
        Recorded {
            mem: FlatMemory::new(KEY, cmds * CMD_LEN as usize),
            filled: vec![0; cmds],
        }
    }
}

impl Memory for Recorded {
    fn read_local(&mut self, lkey: Lkey, addr: u64, out: &mut [u8]) -> Result<(), MemoryError> {
        self.mem.read_local(lkey, addr, out)
    }
    fn write_local(&mut self, lkey: Lkey, addr: u64, data: &[u8]) -> Result<(), MemoryError> {
        self.mem.write_local(lkey, addr, data)?;
        let cmd = (addr / CMD_LEN) as usize;
        let end = addr + data.len() as u64 - cmd as u64 * CMD_LEN;
        self.filled[cmd] = self.filled[cmd].max(end);
        Ok(())
    }
    fn remote_check(
        &mut self,
        rkey: Rkey,
        addr: u64,
        len: u64,
        access: RemoteAccess,
    ) -> Result<(), MemoryError> {
        self.mem.remote_check(rkey, addr, len, access)
    }
    fn remote_write(&mut self, rkey: Rkey, addr: u64, data: &[u8]) -> Result<(), MemoryError> {
        self.mem.remote_write(rkey, addr, data)
    }
    fn remote_read(&mut self, rkey: Rkey, addr: u64, out: &mut [u8]) -> Result<(), MemoryError> {
        self.mem.remote_read(rkey, addr, out)
    }
    fn remote_atomic(
        &mut self,
        rkey: Rkey,
        addr: u64,
        compare: Option<u64>,
        operand: u64,
    ) -> Result<u64, MemoryError> {
        self.mem.remote_atomic(rkey, addr, compare, operand)
    }
    fn invalidate(&mut self, rkey: Rkey) -> Result<(), MemoryError> {
        self.mem.invalidate(rkey)
    }
}

// ------------------------------------------------------------ rxe-like responder

/// A READ remembered for re-requests, as rxe's `struct resp_res` keeps it.
#[derive(Debug, Clone, Copy)]
struct ReadResource {
    first: Psn,
    last: Psn,
    /// Where the last answered request for it started (rxe resets it on
    /// every answered re-request: "Reset the resource, except length").
    va_org: u64,
    length: u32,
    rkey: Rkey,
}

/// The responder of Linux rxe, reduced to what READs and SENDs need.
struct RxeResponder {
    /// The initiator's data-out buffers.
    mem: Vec<u8>,
    /// Expected PSN (`qp->resp.psn`).
    epsn: Psn,
    /// One past the last PSN a SEND was acknowledged for (`qp->resp.ack_psn`).
    ack_psn: Psn,
    sent_psn_nak: bool,
    msn: u32,
    /// Responder resources, a ring of max_dest_rd_atomic slots.
    resources: Vec<Option<ReadResource>>,
    head: usize,
    out: VecDeque<Packet<Vec<u8>>>,
    /// Re-requests answered and dropped unmatched.
    matched: u64,
    unmatched: u64,
}

impl RxeResponder {
    fn new(len: usize, max_dest_rd_atomic: usize) -> RxeResponder {
        RxeResponder {
            mem: {
                // Seeded noise, shifted by a byte per command: no two
                // packets carry the same bytes, so data placed at the
                // wrong offset cannot pass for the right one.
                let cmd_len = CMD_LEN as usize;
                let mut noise = vec![0; cmd_len + len / cmd_len];
                Rng::new(0x5EED).fill(&mut noise);
                let mut mem = vec![0; len];
                for (cmd, chunk) in mem.chunks_mut(cmd_len).enumerate() {
                    chunk.copy_from_slice(&noise[cmd..cmd + chunk.len()]);
                }
                mem
            },
            epsn: Psn::new(0),
            ack_psn: Psn::new(0),
            sent_psn_nak: false,
            msn: 0,
            resources: vec![None; max_dest_rd_atomic],
            head: 0,
            out: VecDeque::new(),
            matched: 0,
            unmatched: 0,
        }
    }

    fn ack(&mut self, psn: Psn, syndrome: Syndrome) {
        let mut p = Packet::new(
            Opcode::RcAcknowledge,
            Pkey::DEFAULT,
            Qpn::new(REQUESTER_QPN).unwrap(),
            psn,
        );
        p.ext.aeth = Some(AethRepr {
            syndrome,
            msn: self.msn,
        });
        self.out.push_back(p);
    }

    fn handle(&mut self, pkt: &Packet<Vec<u8>>) {
        let psn = pkt.bth.psn;
        let d = psn.diff(self.epsn);
        if d > 0 {
            // check_psn: one NAK per gap.
            if !self.sent_psn_nak {
                self.sent_psn_nak = true;
                let epsn = self.epsn;
                self.ack(epsn, Syndrome::Nak(NakCode::PsnSequenceError));
            }
            return;
        }
        if d < 0 {
            self.duplicate(pkt);
            return;
        }
        self.sent_psn_nak = false;
        match pkt.bth.opcode {
            Opcode::RcSendOnly => {
                self.msn += 1;
                self.epsn = psn.next();
                self.ack_psn = self.epsn;
                if pkt.bth.ack_req {
                    self.ack(psn, Syndrome::Ack(CreditCount::UNLIMITED));
                }
            }
            Opcode::RcReadRequest => {
                let reth = pkt.ext.reth.expect("READ request without RETH");
                let npkts = u64::from(reth.dma_len).div_ceil(PMTU).max(1) as u32;
                self.msn += 1;
                self.resources[self.head] = Some(ReadResource {
                    first: psn,
                    last: psn.add(npkts - 1),
                    va_org: reth.va,
                    length: reth.dma_len,
                    rkey: reth.rkey,
                });
                self.head = (self.head + 1) % self.resources.len();
                self.reply(psn, reth, true);
                self.epsn = psn.add(npkts);
            }
            other => panic!("the requester sent {other:?}: not in this workload"),
        }
    }

    /// rxe's `duplicate_request`.
    fn duplicate(&mut self, pkt: &Packet<Vec<u8>>) {
        let psn = pkt.bth.psn;
        match pkt.bth.opcode {
            Opcode::RcSendOnly => {
                let last = self.ack_psn.sub(1);
                self.ack(last, Syndrome::Ack(CreditCount::UNLIMITED));
            }
            Opcode::RcReadRequest => {
                let reth = pkt.ext.reth.expect("READ request without RETH");
                let slot = self
                    .resources
                    .iter_mut()
                    .flatten()
                    .find(|r| psn.diff(r.first) >= 0 && psn.diff(r.last) <= 0);
                let Some(res) = slot else {
                    self.unmatched += 1;
                    return;
                };
                let (va, len) = (reth.va, u64::from(reth.dma_len));
                let end_org = res.va_org + u64::from(res.length);
                if va < res.va_org
                    || reth.dma_len > res.length
                    || va + len > end_org
                    || reth.rkey != res.rkey
                {
                    self.unmatched += 1;
                    return;
                }
                res.va_org = va;
                let from_first = psn == res.first;
                self.matched += 1;
                self.reply(psn, reth, from_first);
            }
            other => panic!("the requester sent {other:?}: not in this workload"),
        }
    }

    /// READ responses for `reth` from `psn` on: FIRST/ONLY when the READ
    /// is answered from its start, MIDDLE/LAST for a replay from inside.
    fn reply(&mut self, psn: Psn, reth: RethRepr, from_first: bool) {
        let len = u64::from(reth.dma_len);
        let npkts = len.div_ceil(PMTU).max(1);
        for k in 0..npkts {
            let off = k * PMTU;
            let n = (len - off).min(PMTU);
            let last = k + 1 == npkts;
            let opcode = match (k == 0 && from_first, last) {
                (true, true) => Opcode::RcReadResponseOnly,
                (true, false) => Opcode::RcReadResponseFirst,
                (false, true) => Opcode::RcReadResponseLast,
                (false, false) => Opcode::RcReadResponseMiddle,
            };
            let mut p = Packet::new(
                opcode,
                Pkey::DEFAULT,
                Qpn::new(REQUESTER_QPN).unwrap(),
                psn.add(k as u32),
            );
            if opcode != Opcode::RcReadResponseMiddle {
                p.ext.aeth = Some(AethRepr {
                    syndrome: Syndrome::Ack(CreditCount::UNLIMITED),
                    msn: self.msn,
                });
            }
            let at = (reth.va + off) as usize;
            p.payload = self.mem[at..at + n as usize].to_vec();
            self.out.push_back(p);
        }
    }
}

// ------------------------------------------------------------ network

/// A packet on a simulated link, sized as it is on the wire (headers
/// beside the payload), so the line rate spaces packets out.
#[derive(Clone)]
struct Frame(Packet<Vec<u8>>);

impl SimPayload for Frame {
    fn bit_len(&self) -> u64 {
        (self.0.payload.len() as u64 + 70) * 8
    }
    /// The links here never corrupt (`corrupt` is 0).
    fn flip_bit(&mut self, _bit: u64) {}
}

fn link() -> FaultInjector<Frame> {
    FaultInjector::new(FaultConfig {
        latency: Duration::from_micros(10),
        bytes_per_sec: Some(125_000_000),
        ..FaultConfig::default()
    })
}

/// Which READ response packets the link from the responder loses.
enum Loss {
    /// The n-th READ response packet the responder sends (0-based).
    Nth(Vec<u64>),
    /// Each with this probability, from a seeded generator.
    Random(Rng, f64),
}

/// One READ request packet the requester sent.
#[derive(Debug, Clone, Copy)]
struct ReadRequestSent {
    cmd: usize,
    /// Byte offset into the command's data it asks from, and how many.
    offset: u64,
    len: u64,
    /// Bytes of the command the requester held when it sent it.
    held: u64,
    psn: Psn,
    /// When it was sent.
    at: Instant,
}

struct Target {
    now: Instant,
    qp: Qp,
    mem: Recorded,
    rxe: RxeResponder,
    to_rxe: FaultInjector<Frame>,
    to_target: FaultInjector<Frame>,
    loss: Loss,
    cmds: usize,
    queue_depth: usize,
    posted: usize,
    wcs: Vec<Completion>,
    read_requests: Vec<ReadRequestSent>,
    /// READ response packets the responder sent, and those lost.
    responses_sent: u64,
    responses_lost: u64,
}

impl Target {
    fn new(cmds: usize, loss: Loss) -> Target {
        let mut cfg = QpConfig::rc(
            Qpn::new(REQUESTER_QPN).unwrap(),
            Qpn::new(RESPONDER_QPN).unwrap(),
        );
        cfg.pmtu = Mtu::Mtu4096;
        // ib_srp asks for 4 responder resources; the target's initiator
        // depth follows it.
        cfg.max_rd_atomic = 4;
        cfg.timeout = 12; // 16.8 ms
        cfg.retry_cnt = 7;
        let mut qp = Qp::new(cfg);
        qp.set_rts();
        let mut t = Target {
            now: Instant::ZERO,
            qp,
            mem: Recorded::new(cmds),
            rxe: RxeResponder::new(cmds * CMD_LEN as usize, 4),
            to_rxe: link(),
            to_target: link(),
            loss,
            cmds,
            queue_depth: 8,
            posted: 0,
            wcs: Vec::new(),
            read_requests: Vec::new(),
            responses_sent: 0,
            responses_lost: 0,
        };
        while t.posted < t.queue_depth.min(cmds) {
            t.post_read();
        }
        t
    }

    /// The next command's data-out READ.
    fn post_read(&mut self) {
        let cmd = self.posted as u64;
        self.qp.post_send(SendWqe::new(
            cmd,
            SendOp::Read {
                raddr: cmd * CMD_LEN,
                rkey: Rkey(KEY),
            },
            vec![Sge {
                addr: cmd * CMD_LEN,
                len: CMD_LEN as u32,
                lkey: Lkey(KEY),
            }],
        ));
        self.posted += 1;
    }

    /// The command's response (SRP_RSP), once its data is in.
    fn post_response(&mut self, cmd: u64) {
        let mut wqe = SendWqe::new(1_000_000 + cmd, SendOp::Send, Vec::new());
        wqe.inline = Some(vec![0xC1; 36]);
        self.qp.post_send(wqe);
    }

    fn lose(&mut self) -> bool {
        let n = self.responses_sent;
        self.responses_sent += 1;
        match &mut self.loss {
            Loss::Nth(which) => which.contains(&n),
            Loss::Random(rng, p) => rng.chance(*p),
        }
    }

    /// One round at `now`; returns whether anything happened.
    fn round(&mut self) -> bool {
        let now = self.now;
        let mut busy = false;
        while let Some(p) = self.qp.poll_transmit(now, &mut self.mem) {
            busy = true;
            if p.bth.opcode == Opcode::RcReadRequest {
                let reth = p.ext.reth.unwrap();
                let cmd = (reth.va / CMD_LEN) as usize;
                self.read_requests.push(ReadRequestSent {
                    cmd,
                    offset: reth.va - cmd as u64 * CMD_LEN,
                    len: u64::from(reth.dma_len),
                    held: self.mem.filled[cmd],
                    psn: p.bth.psn,
                    at: now,
                });
            }
            self.to_rxe.push(now, Frame(p));
        }
        while let Some(p) = self.rxe.out.pop_front() {
            busy = true;
            let is_response = matches!(
                p.bth.opcode,
                Opcode::RcReadResponseFirst
                    | Opcode::RcReadResponseMiddle
                    | Opcode::RcReadResponseLast
                    | Opcode::RcReadResponseOnly
            );
            if is_response && self.lose() {
                self.responses_lost += 1;
                continue;
            }
            self.to_target.push(now, Frame(p));
        }
        while let Some(Frame(p)) = self.to_rxe.pop_ready(now) {
            busy = true;
            self.rxe.handle(&p);
        }
        while let Some(Frame(p)) = self.to_target.pop_ready(now) {
            busy = true;
            self.qp.handle_packet(now, &p.as_received(), &mut self.mem);
        }
        if self.qp.poll_timeout().is_some_and(|t| t <= now) {
            busy = true;
            self.qp.handle_timeout(now);
        }
        while let Some(c) = self.qp.poll_completion() {
            busy = true;
            if c.status == WcStatus::Success && c.opcode == WcOpcode::RdmaRead {
                self.post_response(c.wr_id);
                if self.posted < self.cmds {
                    self.post_read();
                }
            }
            self.wcs.push(c);
        }
        busy
    }

    /// Runs until every command is answered, nothing is left to happen,
    /// or a minute of virtual time has passed.
    fn run(&mut self) {
        let deadline = self.now + Duration::from_secs(60);
        for _ in 0..10_000_000 {
            if self.wcs.len() == 2 * self.cmds {
                return;
            }
            if self.round() {
                continue;
            }
            let next = [
                self.to_rxe.next_release(),
                self.to_target.next_release(),
                self.qp.poll_timeout(),
            ]
            .into_iter()
            .flatten()
            .min();
            match next {
                Some(t) if t <= deadline => self.now = self.now.max(t),
                _ => return,
            }
        }
        panic!("step budget exhausted: livelock at {:?}", self.now);
    }

    /// READ request packets sent beyond each READ's first.
    fn re_requests(&self) -> usize {
        self.read_requests.len() - self.cmds
    }

    fn describe(&self) -> String {
        let mut s = format!(
            "{} of {} completions ({:?}), responses sent {} lost {}, re-requests {} \
             (rxe answered {}, dropped {}), requester {:?}\nREAD requests (cmd, offset, held, psn, at):",
            self.wcs.len(),
            2 * self.cmds,
            self.wcs.iter().find(|c| c.status != WcStatus::Success),
            self.responses_sent,
            self.responses_lost,
            self.re_requests(),
            self.rxe.matched,
            self.rxe.unmatched,
            self.qp.counters(),
        );
        for r in self.read_requests.iter().take(60) {
            s += &format!(
                "\n  {} {} {} {} {:?}",
                r.cmd,
                r.offset,
                r.held,
                r.psn.value(),
                r.at
            );
        }
        s
    }

    /// What must hold after any run: every command completed with the
    /// right data, rxe could answer every re-request, and none asked for
    /// data the requester already held (nor skipped data it lacked).
    fn check(&self) {
        let why = self.describe();
        assert_eq!(self.wcs.len(), 2 * self.cmds, "{why}");
        assert!(
            self.wcs.iter().all(|c| c.status == WcStatus::Success),
            "{why}"
        );
        self.mem.mem.with(|got| {
            assert!(got == &self.rxe.mem[..], "data differs\n{why}");
        });
        for r in &self.read_requests {
            assert_eq!(
                r.offset,
                r.held,
                "a READ request for cmd {} at psn {} asks from byte {} while the \
                 requester holds {} bytes of it\n{why}",
                r.cmd,
                r.psn.value(),
                r.offset,
                r.held,
            );
            assert_eq!(r.offset + r.len, CMD_LEN, "the rest of the READ: {r:?}");
        }
        assert_eq!(self.rxe.unmatched, 0, "re-requests rxe cannot match\n{why}");
    }
}

// ------------------------------------------------------------ tests

#[test]
fn one_lost_read_response_is_re_requested_once_from_the_missing_packet() {
    // Each run loses one response packet: packet k % 16 of READ k / 16.
    // From READ 4 on, the responses (SENDs) of earlier commands sit
    // between the READs, so ACKs pass the unfinished READ -- the original
    // ACKs, and the duplicate ACKs of the SENDs go-back-N sends again,
    // which rxe gives the newest PSN it acknowledged. The loss is revealed
    // by a later response or by such an ACK; either way it costs one
    // go-back-N: the READ asked again from its missing packet (with the VA
    // and length of what is missing), the READs behind it again in full
    // (at most the initiator depth in all), and no timeout.
    for k in 0..12 * 16u64 {
        let mut t = Target::new(16, Loss::Nth(vec![k]));
        t.run();
        t.check();
        let why = format!("response {k} lost\n{}", t.describe());
        assert_eq!(t.responses_lost, 1, "{why}");
        let (cmd, pkt) = ((k / 16) as usize, k % 16);
        let partial: Vec<_> = t
            .read_requests
            .iter()
            .filter(|r| r.offset > 0)
            .map(|r| (r.cmd, r.offset))
            .collect();
        let want = if pkt > 0 {
            vec![(cmd, pkt * PMTU)]
        } else {
            vec![]
        };
        assert_eq!(partial, want, "{why}");
        let asked = t.read_requests.iter().filter(|r| r.cmd == cmd).count();
        assert_eq!(asked, 2, "READ {cmd} asked for twice\n{why}");
        assert!(t.re_requests() <= 4, "{why}");
        assert_eq!(t.qp.counters().timeouts, 0, "{why}");
    }
}

#[test]
fn read_responses_lost_at_random_cost_a_bounded_number_of_re_requests() {
    for (loss, seeds) in [(0.02, 0..16u64), (0.05, 16..32)] {
        for seed in seeds {
            let mut t = Target::new(48, Loss::Random(Rng::new(seed), loss));
            t.run();
            t.check();
            // Each lost response costs at most one go-back-N over the READs
            // in flight (the initiator depth, 4), whichever sign reveals it
            // (a later response, an ACK past the READ, the timeout).
            assert!(
                t.re_requests() as u64 <= 4 * t.responses_lost,
                "loss {loss} seed {seed}: {} re-requests for {} lost responses\n{}",
                t.re_requests(),
                t.responses_lost,
                t.describe()
            );
        }
    }
}
