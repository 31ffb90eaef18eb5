//! The soft RoCE data path over real loopback sockets, with a fixed amount
//! of work: two nodes on one thread move 1 MiB RDMA WRITEs and READs and
//! 4 KiB WRITEs. Prints MiB/s and packets per second for each; the same
//! fixed workload under `valgrind --tool=callgrind` gives instruction
//! counts of the send path (`--toggle-collect='*Node*transmit*'`) that do
//! not depend on the machine's load.
//!
//! `cargo bench -p softroce --bench send_path`; `SOFTROCE_BENCH_ROUNDS`
//! scales the work (default 64 MiB each way, 4096 small WRITEs, 1024
//! WRITEs of 64 KiB at queue depth 16 as `rperf` posts them);
//! `SOFTROCE_BENCH_CASE=write64k` (a prefix of a case name) runs only the
//! cases it names, so a callgrind run with
//! `--toggle-collect='*Node*receive*'` divided by the message count is the
//! receive path's instructions per message. `SOFTROCE_GSO=0` turns UDP
//! GSO/GRO off, as for the tools.

use rdma_types::{Instant, Lkey, Mtu, Qpn, Rkey, WcStatus};
use roce::{QpConfig, SendOp, SendWqe, Sge};
use softroce::{FlatMemory, Node, NodeConfig, QpHandle};
use std::time::{Duration, Instant as StdInstant};

const KEY: u32 = 1;
const MIB: usize = 1 << 20;

struct Pair {
    a: Node,
    b: Node,
    qa: QpHandle,
    epoch: StdInstant,
}

impl Pair {
    fn new() -> Pair {
        // `SOFTROCE_GSO=0` measures without UDP GSO/GRO, as the tools do.
        let node = |addr: &str| {
            let mut cfg = NodeConfig::new(addr.parse().unwrap());
            cfg.gso = softroce::gso_from_env();
            cfg.gro = cfg.gso;
            Node::bind(cfg).unwrap()
        };
        let (mut a, mut b) = (node("127.0.160.20:0"), node("127.0.160.21:0"));
        let mut cfg = QpConfig::rc(Qpn::new(0).unwrap(), Qpn::new(0).unwrap());
        cfg.pmtu = Mtu::Mtu4096;
        let qa = a.create_qp(cfg.clone(), Box::new(FlatMemory::new(KEY, 2 * MIB)));
        let qb = b.create_qp(cfg, Box::new(FlatMemory::new(KEY, 2 * MIB)));
        Node::connect_pair(&mut a, qa, &mut b, qb);
        Pair {
            a,
            b,
            qa,
            epoch: StdInstant::now(),
        }
    }

    /// Posts `count` operations of `len` bytes, at most `depth` in flight,
    /// and drives both nodes until all completed (bounded: 120 s).
    fn run(&mut self, op: fn(u64) -> SendOp, len: usize, count: usize, depth: usize) {
        let (mut posted, mut done) = (0, 0);
        let deadline = StdInstant::now() + Duration::from_secs(120);
        while done < count {
            assert!(StdInstant::now() < deadline, "bench stalled");
            while posted < count && posted - done < depth {
                let sge = Sge {
                    addr: 0,
                    len: len as u32,
                    lkey: Lkey(KEY),
                };
                let raddr = (MIB + (posted * len) % MIB) as u64;
                let qp = self.a.qp_mut(self.qa).unwrap();
                qp.post_send(SendWqe::new(posted as u64, op(raddr), vec![sge]));
                posted += 1;
            }
            let now = Instant::from_std(self.epoch, StdInstant::now());
            let busy = self.a.poll(now) | self.b.poll(now);
            while let Some(c) = self.a.poll_completion(self.qa) {
                assert_eq!(c.status, WcStatus::Success);
                done += 1;
            }
            if !busy {
                let _ = self.a.wait(Duration::from_micros(100));
            }
        }
    }
}

fn write(raddr: u64) -> SendOp {
    SendOp::Write {
        raddr,
        rkey: Rkey(KEY),
    }
}

fn read(raddr: u64) -> SendOp {
    SendOp::Read {
        raddr,
        rkey: Rkey(KEY),
    }
}

/// Name, operation for a remote address, bytes per operation, count.
type Case = (&'static str, fn(u64) -> SendOp, usize, usize);

fn main() {
    let rounds: usize = std::env::var("SOFTROCE_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64);
    let mut p = Pair::new();
    let only = std::env::var("SOFTROCE_BENCH_CASE").unwrap_or_default();
    let cases: [Case; 4] = [
        ("write1m qd4", write, MIB, rounds),
        ("read1m qd4", read, MIB, rounds),
        ("write4k qd32", write, 4096, 64 * rounds),
        ("write64k qd16", write, 64 << 10, 16 * rounds),
    ];
    for (name, op, len, count) in cases.into_iter().filter(|c| c.0.starts_with(&only)) {
        let sent = p.a.stats().tx_packets + p.b.stats().tx_packets;
        let t = StdInstant::now();
        let depth = match len {
            MIB => 4,
            4096 => 32,
            _ => 16,
        };
        p.run(op, len, count, depth);
        let secs = t.elapsed().as_secs_f64();
        let packets = p.a.stats().tx_packets + p.b.stats().tx_packets - sent;
        println!(
            "{name:>14}: {:8.1} MiB/s {:9.0} ops/s {:9.0} packets/s ({packets} packets)",
            (len * count) as f64 / MIB as f64 / secs,
            count as f64 / secs,
            packets as f64 / secs,
        );
    }
}
