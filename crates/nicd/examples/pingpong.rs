//! 64-byte RC SEND ping-pong between two soft RoCE CAs on loopback
//! addresses, three ways: the NIC in this process, through a NIC daemon
//! with every verb on its socket (protocol version 1), and through the
//! daemon's shared-memory rings (version 2). The daemon runs in this
//! process on threads of its own, each side is a client of its own, as
//! two processes would be.
//!
//! ```text
//! cargo run --release -p nicd --example pingpong -- [ITERATIONS] [MODE...] [WAIT]
//! ```
//!
//! MODE is `inproc`, `socket` or `rings` (all three by default);
//! `stream` runs the stream alone (no ping-pong, e.g. under `strace -ff`
//! to count the writing thread's calls); `spin-us=N` sets how long the daemon's ring poller spins after its
//! last work (`Server::set_ring_spin`, 5 by default). WAIT is
//! how a side waits for its message: `spin` (poll without pause),
//! `yield` (poll, and give the CPU up between empty polls: the default,
//! as the NIC's own threads need it on a small machine) or `notify`
//! (poll, arm the CQ, poll, `wait_cq`, as `rpingpong` does). For each
//! it prints the round trip's median and mean, and for a client of the
//! daemon its system calls of the data path per round trip (requests on
//! the socket and doorbells, from `NicdProvider::counters`), posts and
//! polls. Then a stream on the same QPs: 64-byte RDMA WRITEs, 32 in
//! flight, ten times ITERATIONS of them: the rate, and the system calls
//! per WRITE (a busy queue, where the rings make none). Under
//! `strace -c -f` the whole process's calls are counted (the daemon's
//! and the NIC's threads too).

use nicd::{NicdProvider, Server};
use rdma_types::{Guid, Lid, QpType, WcOpcode, WcStatus};
use rnic::softroce::{SoftCa, SoftRoce, ROCE_PORT};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};
use verbs::conformance::{connect, Feature, Fixture, Node};
use verbs::{Provider, RecvWr, SendOpcode, SendWr, VerbsError, WorkCompletion};

/// Bytes per message.
const MSG: u32 = 64;
/// Receives kept posted on each side.
const RECVS: u64 = 8;
/// Round trips before the measured ones.
const WARMUP: u64 = 200;
/// Longest wait for one message before the run is given up.
const STALL: Duration = Duration::from_secs(10);

/// Opens nodes on a provider (the conformance kit's `Node` needs one).
struct Fx(Arc<dyn Provider>, Guid);

impl Fixture for Fx {
    fn provider(&self) -> Arc<dyn Provider> {
        self.0.clone()
    }
    fn guids(&self) -> (Guid, Guid) {
        (self.1, self.1)
    }
    fn set_port_active(&self, _: Guid, _: bool) -> verbs::Result<()> {
        Err(VerbsError::NotSupported("port control"))
    }
    fn set_lid(&self, _: Guid, _: Lid) -> verbs::Result<()> {
        Err(VerbsError::NotSupported("port control"))
    }
    fn remove_ca(&self, _: Guid) -> verbs::Result<()> {
        Err(VerbsError::NotSupported("port control"))
    }
    fn lacks(&self) -> Vec<Feature> {
        Vec::new()
    }
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Mode {
    InProc,
    Socket,
    Rings,
}

fn recv(n: &Node, id: u64) -> RecvWr {
    RecvWr {
        wr_id: id,
        sges: verbs::sges![n.sge(4096 + (id % RECVS) * 256, MSG)],
    }
}

/// How a side waits for its message.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Wait {
    Spin,
    Yield,
    Notify,
}

/// Polls the CQ until a receive completes (waiting as `wait` says);
/// send completions are taken on the way.
fn await_recv(n: &Node, wait: Wait) -> u64 {
    let blank = WorkCompletion::new(0, WcStatus::GeneralErr, WcOpcode::Send, 0);
    let mut wcs = [blank; 8];
    let start = Instant::now();
    loop {
        let k = n.p.poll_cq(n.cq, &mut wcs).expect("poll");
        let mut got = None;
        for wc in &wcs[..k] {
            assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
            if wc.opcode == WcOpcode::Recv {
                got = Some(wc.wr_id);
            }
        }
        if let Some(id) = got {
            return id;
        }
        assert!(start.elapsed() < STALL, "no message within {STALL:?}");
        match wait {
            Wait::Spin => std::hint::spin_loop(),
            Wait::Yield => std::thread::yield_now(),
            Wait::Notify => {
                n.p.req_notify_cq(n.cq, false).expect("arm");
                let k = n.p.poll_cq(n.cq, &mut wcs).expect("poll");
                if let Some(wc) = wcs[..k].iter().find(|w| w.opcode == WcOpcode::Recv) {
                    return wc.wr_id;
                }
                let _ = n.p.wait_cq(n.cq, Duration::from_millis(20));
            }
        }
    }
}

/// One side's turn: the initiator sends, then waits for the answer;
/// the other waits, then answers. Each reposts its last receive after
/// its send, off the message's path (eight stay posted).
fn ping(n: &Node, qp: verbs::QpHandle, answer: bool, wait: Wait, last: &mut Option<u64>) {
    let mut w = SendWr::new(0, SendOpcode::Send, vec![n.sge(0, MSG)]);
    w.flags = verbs::SendFlags::SIGNALED;
    if answer {
        *last = Some(await_recv(n, wait));
    }
    n.p.post_send(qp, &[w]).expect("send");
    if let Some(id) = last.take() {
        n.p.post_recv(qp, &[recv(n, id + RECVS)]).expect("repost");
    }
    if !answer {
        *last = Some(await_recv(n, wait));
    }
}

fn run(mode: Mode, iters: u64, m: u8, wait: Wait, spin: Option<Duration>, pingpong: bool) {
    let ip = |x| IpAddr::V4(Ipv4Addr::new(127, 29, m, x));
    let (g1, g2) = (Guid(0x2901), Guid(0x2902));
    let cas = vec![
        SoftCa {
            guid: g1,
            ip: ip(1),
        },
        SoftCa {
            guid: g2,
            ip: ip(2),
        },
    ];
    let soft = SoftRoce::new(cas, ROCE_PORT);
    let path = std::env::temp_dir().join(format!("nicd-pingpong-{}-{m}.sock", std::process::id()));
    let mut clients = Vec::new();
    let (pa, pb): (Arc<dyn Provider>, Arc<dyn Provider>) = match mode {
        Mode::InProc => (soft.clone(), soft.clone()),
        Mode::Socket | Mode::Rings => {
            let l = nicd::server::bind(&path, false).expect("bind the daemon's socket");
            let server = Server::new(soft.clone());
            if let Some(spin) = spin {
                server.set_ring_spin(spin);
            }
            server.serve(l);
            let rings = mode == Mode::Rings;
            let a = NicdProvider::connect_with(&path, rings).expect("client a");
            let b = NicdProvider::connect_with(&path, rings).expect("client b");
            assert_eq!(a.uses_rings(), rings);
            clients = vec![a.clone(), b.clone()];
            (a, b)
        }
    };
    let a = Node::open(&Fx(pa, g1), g1, 256);
    let b = Node::open(&Fx(pb, g2), g2, 256);
    let (qa, qb) = (a.qp(QpType::Rc, None, 1), b.qp(QpType::Rc, None, 2));
    connect(&a, qa, &b, qb, QpType::Rc, 7);
    for i in 0..RECVS {
        a.p.post_recv(qa, &[recv(&a, i)]).expect("recv a");
        b.p.post_recv(qb, &[recv(&b, i)]).expect("recv b");
    }
    if !pingpong {
        stream(&a, qa, &b, iters * 10, &clients, mode);
        let _ = std::fs::remove_file(&path);
        return;
    }
    let total = WARMUP + iters;
    let mut rtts = Vec::with_capacity(iters as usize);
    let mut before = Vec::new();
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut last = None;
            (0..total).for_each(|_| ping(&b, qb, true, wait, &mut last))
        });
        let mut last = None;
        for i in 0..total {
            if i == WARMUP {
                before = clients.iter().map(|c| c.counters()).collect();
            }
            let t = Instant::now();
            ping(&a, qa, false, wait, &mut last);
            if i >= WARMUP {
                rtts.push(t.elapsed());
            }
        }
    });
    rtts.sort();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let mean = rtts.iter().map(|d| us(*d)).sum::<f64>() / rtts.len() as f64;
    let p50 = us(rtts[rtts.len() / 2]);
    let p99 = us(rtts[rtts.len() * 99 / 100]);
    print!(
        "{:<7} {:<6} {iters} round trips of {MSG} B: p50 {p50:7.1} us  mean {mean:7.1} us  p99 {p99:7.1} us",
        format!("{mode:?}").to_lowercase(),
        format!("{wait:?}").to_lowercase()
    );
    for (c, b) in clients.iter().zip(&before) {
        let n = c.counters();
        let per = |x: u64, y: u64| (x - y) as f64 / iters as f64;
        print!(
            " | client: {:.2} socket calls + {:.2} doorbells + {:.2} futex waits per round trip ({:.2} ring posts, {:.0} ring polls)",
            per(n.socket_calls, b.socket_calls),
            per(n.doorbells, b.doorbells),
            per(n.take_waits, b.take_waits),
            per(n.ring_posts, b.ring_posts),
            per(n.ring_polls, b.ring_polls),
        );
    }
    println!();
    stream(&a, qa, &b, iters * 10, &clients, mode);
    let _ = std::fs::remove_file(&path);
}

/// WRITEs in flight in the stream.
const DEPTH: u64 = 32;

/// `n` signaled 64-byte WRITEs from `a` into `b`'s memory, [`DEPTH`] in
/// flight, polled as they complete.
fn stream(
    a: &Node,
    qa: verbs::QpHandle,
    b: &Node,
    n: u64,
    clients: &[Arc<NicdProvider>],
    mode: Mode,
) {
    let blank = WorkCompletion::new(0, WcStatus::GeneralErr, WcOpcode::Send, 0);
    let mut wcs = [blank; 16];
    let before: Vec<_> = clients.iter().map(|c| c.counters()).collect();
    let t = Instant::now();
    let (mut posted, mut done, mut polls) = (0u64, 0u64, 0u64);
    while done < n {
        while posted < n && posted - done < DEPTH {
            let mut w = SendWr::new(posted, SendOpcode::RdmaWrite, vec![a.sge(0, MSG)]);
            w.remote = verbs::RemoteAddr {
                addr: b.buf.addr() + 8192 + (posted % 64) * 64,
                rkey: b.mr.rkey,
            };
            a.p.post_send(qa, &[w]).expect("write");
            posted += 1;
        }
        let k = a.p.poll_cq(a.cq, &mut wcs).expect("poll");
        polls += 1;
        for wc in &wcs[..k] {
            assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
        }
        done += k as u64;
        if k == 0 {
            std::thread::yield_now();
        }
        assert!(
            t.elapsed() < STALL * 10,
            "the stream stalled at {done} of {n}"
        );
    }
    let secs = t.elapsed().as_secs_f64();
    print!(
        "{:<7} stream {n} WRITEs of {MSG} B, {DEPTH} in flight: {:8.0} per s, {:.1} polls per WRITE",
        format!("{mode:?}").to_lowercase(),
        n as f64 / secs,
        polls as f64 / n as f64
    );
    if let (Some(c), Some(b)) = (clients.first(), before.first()) {
        let now = c.counters();
        let per = |x: u64, y: u64| (x - y) as f64 / n as f64;
        print!(
            " | writer: {:.3} socket calls + {:.3} doorbells + {:.3} futex waits per WRITE ({:.2} through the ring)",
            per(now.socket_calls, b.socket_calls),
            per(now.doorbells, b.doorbells),
            per(now.take_waits, b.take_waits),
            per(now.ring_posts, b.ring_posts),
        );
    }
    println!();
}

fn main() {
    let mut args = std::env::args().skip(1);
    let iters: u64 = args
        .next()
        .map(|a| a.parse().expect("ITERATIONS: a number"))
        .unwrap_or(2000);
    let mut wait = Wait::Yield;
    let mut spin = None;
    let mut pingpong = true;
    let mut modes = Vec::new();
    for a in args {
        match a.as_str() {
            "inproc" => modes.push(Mode::InProc),
            "socket" => modes.push(Mode::Socket),
            "rings" => modes.push(Mode::Rings),
            "spin" => wait = Wait::Spin,
            "yield" => wait = Wait::Yield,
            "notify" => wait = Wait::Notify,
            "stream" => pingpong = false,
            s if s.starts_with("spin-us=") => {
                let us = s["spin-us=".len()..].parse().expect("spin-us=MICROSECONDS");
                spin = Some(Duration::from_micros(us));
            }
            other => {
                panic!("{other:?}: inproc, socket, rings, spin, yield, notify, stream or spin-us=N")
            }
        }
    }
    let modes = if modes.is_empty() {
        vec![Mode::InProc, Mode::Socket, Mode::Rings]
    } else {
        modes
    };
    for (m, mode) in modes.into_iter().enumerate() {
        run(mode, iters, m as u8 + 1, wait, spin, pingpong);
    }
}
