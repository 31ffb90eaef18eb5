//! Loopback provider throughput and latency, against memcpy measured in the
//! same run: RDMA WRITE 64 KiB and 1 MiB (bandwidth), WRITE 8 B (per-WR
//! cost), SEND 8 B (latency). `cargo bench -p rnic --bench loopback`;
//! prints a table with ratios.
//!
//! The memcpy baseline copies the same bytes between the same two
//! registered buffers with the same routine the provider uses
//! (`MemBuf::copy_from`). Each WRITE is signaled and polled before the next
//! is posted, so the per-WR cost is paid in full. The machine is shared:
//! WRITE and memcpy runs (32 MiB each, `LOOPBACK_BENCH_MIB` to change)
//! alternate for 101 rounds; "ratio" is best WRITE over best memcpy,
//! "median" the median of the per-round ratios.

use rdma_types::{AccessFlags, QpType, WcOpcode, WcStatus};
use rnic::loopback::{CaConfig, Fabric};
use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;
use verbs::conformance::{connect, Fixture, Node};
use verbs::*;

/// Timed rounds per case (each a WRITE run then a memcpy run).
const ROUNDS: usize = 101;

struct F(Arc<Fabric>);

impl Fixture for F {
    fn provider(&self) -> Arc<dyn Provider> {
        self.0.clone()
    }
    fn guids(&self) -> (rdma_types::Guid, rdma_types::Guid) {
        (rdma_types::Guid(1), rdma_types::Guid(2))
    }
    fn set_port_active(&self, _: rdma_types::Guid, _: bool) -> Result<()> {
        Err(VerbsError::NotSupported("bench"))
    }
    fn set_lid(&self, _: rdma_types::Guid, _: rdma_types::Lid) -> Result<()> {
        Err(VerbsError::NotSupported("bench"))
    }
    fn remove_ca(&self, _: rdma_types::Guid) -> Result<()> {
        Err(VerbsError::NotSupported("bench"))
    }
    fn lacks(&self) -> Vec<verbs::conformance::Feature> {
        vec![]
    }
}

fn main() {
    let fab = Fabric::new();
    fab.add_ca(CaConfig::simple(1, 1)).unwrap();
    fab.add_ca(CaConfig::simple(2, 2)).unwrap();
    let f = F(fab);
    let (a, b) = (
        Node::open(&f, rdma_types::Guid(1), 4096),
        Node::open(&f, rdma_types::Guid(2), 4096),
    );
    let (qa, qb) = (a.qp(QpType::Rc, None, 1), b.qp(QpType::Rc, None, 2));
    connect(&a, qa, &b, qb, QpType::Rc, 7);
    // Bytes copied per timed run (default 32 MiB); smaller under callgrind.
    let per_run: usize = std::env::var("LOOPBACK_BENCH_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(32usize)
        << 20;
    let size = 1 << 20;
    let src = MemBuf::new(size);
    let dst = MemBuf::new(size);
    src.fill(0xab);
    let smr =
        a.p.reg_mr(
            a.pd,
            &src,
            src.addr(),
            size as u64,
            AccessFlags::LOCAL_WRITE,
            0,
        )
        .unwrap();
    let dmr =
        b.p.reg_mr(
            b.pd,
            &dst,
            dst.addr(),
            size as u64,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
            0,
        )
        .unwrap();
    println!(
        "{:<22} {:>12} {:>12} {:>7} {:>7}",
        "case", "loopback", "memcpy", "ratio", "median"
    );
    let mut wcs = [WorkCompletion::new(0, WcStatus::Success, WcOpcode::Send, 0); 4];
    for len in [64usize << 10, 1 << 20] {
        let iters = per_run / len;
        // One WR, built once: the loop measures posting and completing the
        // WRITE, not the consumer allocating its SGE list.
        let mut w = SendWr::new(
            0,
            SendOpcode::RdmaWrite,
            vec![Sge {
                addr: src.addr(),
                length: len as u32,
                lkey: smr.lkey,
            }],
        );
        w.remote = RemoteAddr {
            addr: dst.addr(),
            rkey: dmr.rkey,
        };
        let mut run_write = || {
            let t = Instant::now();
            for i in 0..iters {
                w.wr_id = i as u64;
                a.p.post_send(qa, std::slice::from_ref(&w)).unwrap();
                assert_eq!(a.p.poll_cq(a.cq, &mut wcs).unwrap(), 1);
                assert!(wcs[0].wr_id == i as u64 && wcs[0].status == WcStatus::Success);
            }
            (iters * len) as f64 / t.elapsed().as_secs_f64()
        };
        let run_memcpy = || {
            let t = Instant::now();
            for _ in 0..iters {
                dst.copy_from(0, &src, 0, len);
                black_box(&dst);
            }
            (iters * len) as f64 / t.elapsed().as_secs_f64()
        };
        // The WRITE moved the bytes (the memcpy runs must not be what did).
        dst.fill(0);
        run_write();
        assert!(dst.to_vec(0, len).iter().all(|&x| x == 0xab));
        // Interleave, keep the best of each, to damp noise on a shared
        // machine; also the median of the paired ratios.
        let (mut w, mut m, mut pairs) = (0f64, 0f64, Vec::new());
        for _ in 0..ROUNDS {
            let (x, y) = (run_write(), run_memcpy());
            w = w.max(x);
            m = m.max(y);
            pairs.push(x / y);
        }
        pairs.sort_by(f64::total_cmp);
        println!(
            "{:<22} {:>9.2} GB/s {:>7.2} GB/s {:>7.2} {:>7.2}",
            format!("RDMA WRITE {} KiB", len >> 10),
            w / 1e9,
            m / 1e9,
            w / m,
            pairs[pairs.len() / 2]
        );
    }
    // WRITE 8 B: the per-WR cost (post, checks, completion, poll) that
    // the bandwidth rows pay once per WR on top of the copy.
    let mut w8 = SendWr::new(
        0,
        SendOpcode::RdmaWrite,
        vec![Sge {
            addr: src.addr(),
            length: 8,
            lkey: smr.lkey,
        }],
    );
    w8.remote = RemoteAddr {
        addr: dst.addr(),
        rkey: dmr.rkey,
    };
    let n = 200_000u64;
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        for i in 0..n {
            w8.wr_id = i;
            a.p.post_send(qa, std::slice::from_ref(&w8)).unwrap();
            assert_eq!(a.p.poll_cq(a.cq, &mut wcs).unwrap(), 1);
            assert!(wcs[0].wr_id == i && wcs[0].status == WcStatus::Success);
        }
        best = best.min(t.elapsed().as_secs_f64() / n as f64);
    }
    println!("{:<22} {:>9.0} ns", "RDMA WRITE 8 B per op", best * 1e9);
    // SEND 8 B latency: post a receive, post the send, poll both.
    let n = 200_000;
    let t = Instant::now();
    for i in 0..n {
        b.p.post_recv(
            qb,
            &[RecvWr {
                wr_id: i,
                sges: verbs::sges![Sge {
                    addr: dst.addr(),
                    length: 8,
                    lkey: dmr.lkey,
                }],
            }],
        )
        .unwrap();
        a.p.post_send(
            qa,
            &[SendWr::new(
                i,
                SendOpcode::Send,
                vec![Sge {
                    addr: src.addr(),
                    length: 8,
                    lkey: smr.lkey,
                }],
            )],
        )
        .unwrap();
        assert_eq!(b.p.poll_cq(b.cq, &mut wcs).unwrap(), 1);
        assert_eq!(a.p.poll_cq(a.cq, &mut wcs).unwrap(), 1);
    }
    let lat = t.elapsed().as_secs_f64() / n as f64;
    let t = Instant::now();
    let mut tmp = [0u8; 8];
    for _ in 0..n {
        src.read_at(0, &mut tmp);
        dst.write_at(0, black_box(&tmp));
    }
    let mlat = t.elapsed().as_secs_f64() / n as f64;
    println!(
        "{:<22} {:>9.0} ns   {:>7.0} ns   {:>7.1}",
        "SEND 8 B latency",
        lat * 1e9,
        mlat * 1e9,
        lat / mlat.max(1e-12)
    );
}
