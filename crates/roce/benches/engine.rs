//! Transport engine throughput with no I/O at all: two QPs hand packets to
//! each other in memory. This is the ceiling the UDP driver works under;
//! memcpy of the same bytes is measured in the same run as the baseline.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use rdma_types::{Lkey, Mtu, Qpn, Rkey};
use roce::{FlatMemory, Qp, QpConfig, SendOp, SendWqe, Sge};
use std::hint::black_box;

fn write_through(len: usize, mtu: Mtu, ma: &mut FlatMemory, mb: &mut FlatMemory) {
    let mut ca = QpConfig::rc(Qpn::new(1).unwrap(), Qpn::new(2).unwrap());
    ca.pmtu = mtu;
    let mut cb = ca.clone();
    cb.qpn = ca.dest_qpn;
    cb.dest_qpn = ca.qpn;
    let (mut a, mut b) = (Qp::new(ca), Qp::new(cb));
    a.set_rts();
    b.set_rts();
    let now = rdma_types::Instant::ZERO;
    a.post_send(SendWqe::new(
        1,
        SendOp::Write {
            raddr: 0,
            rkey: Rkey(1),
        },
        vec![Sge {
            addr: 0,
            len: len as u32,
            lkey: Lkey(1),
        }],
    ));
    loop {
        // Payload buffers go back to their engine once "sent", as the
        // soft RoCE node does.
        while let Some(p) = a.poll_transmit(now, ma) {
            b.handle_packet(now, &p.as_received(), mb);
            a.recycle_payload(p.payload);
        }
        while let Some(p) = b.poll_transmit(now, mb) {
            a.handle_packet(now, &p.as_received(), ma);
            b.recycle_payload(p.payload);
        }
        if a.poll_completion().is_some() {
            break;
        }
    }
    black_box(&*mb);
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("rc_write");
    for len in [64 * 1024usize, 1 << 20] {
        g.throughput(Throughput::Bytes(len as u64));
        // Memory is allocated once: fresh pages per iteration would measure
        // page faults, not the engine.
        let (mut ma, mut mb) = (FlatMemory::new(1, len), FlatMemory::new(1, len));
        ma.with(|m| m.fill(7));
        for mtu in [Mtu::Mtu4096, Mtu::Mtu1024] {
            let id = BenchmarkId::new(format!("engine_mtu{}", mtu.bytes()), len);
            g.bench_with_input(id, &len, |bch, &len| {
                bch.iter(|| write_through(len, mtu, &mut ma, &mut mb))
            });
        }
        let src = vec![7u8; len];
        let mut dst = vec![0u8; len];
        g.bench_with_input(BenchmarkId::new("memcpy_baseline", len), &len, |bch, _| {
            bch.iter(|| {
                dst.copy_from_slice(black_box(&src));
                black_box(&dst);
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
