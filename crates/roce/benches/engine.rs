//! Transport engine throughput with no I/O at all: two QPs hand packets to
//! each other in memory. This is the ceiling the UDP driver works under;
//! memcpy of the same bytes is measured in the same run as the baseline.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use rdma_types::{Lkey, Mtu, Qpn, Rkey};
use roce::{Memory, MemoryError, Qp, QpConfig, RemoteAccess, SendOp, SendWqe, Sge};
use std::hint::black_box;

/// One flat region per side; key 1, base 0; no permission model needed here.
struct Flat(Vec<u8>);

impl Flat {
    fn range(&mut self, addr: u64, len: usize) -> Result<&mut [u8], MemoryError> {
        let start = addr as usize;
        self.0
            .get_mut(start..start + len)
            .ok_or(MemoryError::OutOfRange)
    }
}

impl Memory for Flat {
    fn read_local(&mut self, _: Lkey, addr: u64, out: &mut [u8]) -> Result<(), MemoryError> {
        let len = out.len();
        out.copy_from_slice(self.range(addr, len)?);
        Ok(())
    }
    fn write_local(&mut self, _: Lkey, addr: u64, data: &[u8]) -> Result<(), MemoryError> {
        self.range(addr, data.len())?.copy_from_slice(data);
        Ok(())
    }
    fn remote_check(
        &mut self,
        _: Rkey,
        addr: u64,
        len: u64,
        _: RemoteAccess,
    ) -> Result<(), MemoryError> {
        self.range(addr, len as usize).map(|_| ())
    }
    fn remote_write(&mut self, _: Rkey, addr: u64, data: &[u8]) -> Result<(), MemoryError> {
        self.range(addr, data.len())?.copy_from_slice(data);
        Ok(())
    }
    fn remote_read(&mut self, _: Rkey, addr: u64, out: &mut [u8]) -> Result<(), MemoryError> {
        let len = out.len();
        out.copy_from_slice(self.range(addr, len)?);
        Ok(())
    }
    fn remote_atomic(
        &mut self,
        _: Rkey,
        _: u64,
        _: Option<u64>,
        _: u64,
    ) -> Result<u64, MemoryError> {
        Err(MemoryError::NoPermission)
    }
    fn invalidate(&mut self, _: Rkey) -> Result<(), MemoryError> {
        Ok(())
    }
}

fn write_through(len: usize, mtu: Mtu, ma: &mut Flat, mb: &mut Flat) {
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
        while let Some(p) = a.poll_transmit(now, ma) {
            b.handle_packet(now, &p.as_received(), mb);
        }
        while let Some(p) = b.poll_transmit(now, mb) {
            a.handle_packet(now, &p.as_received(), ma);
        }
        if a.poll_completion().is_some() {
            break;
        }
    }
    black_box(&mb.0);
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("rc_write");
    for len in [64 * 1024usize, 1 << 20] {
        g.throughput(Throughput::Bytes(len as u64));
        // Memory is allocated once: fresh pages per iteration would measure
        // page faults, not the engine.
        let (mut ma, mut mb) = (Flat(vec![7u8; len]), Flat(vec![0u8; len]));
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
