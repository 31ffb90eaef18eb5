//! NBD over TCP loopback: 4 KiB and 1 MiB READ and WRITE, 8 requests in
//! flight on one connection, against a RAM device. Baseline in the same
//! run: the same `read_at`/`write_at` called directly on the device, so
//! the protocol's cost shows as a ratio (printed at the end).

#[path = "../tests/common/mod.rs"]
mod common;

use blockload::{BlockDevice, RamDevice};
use common::{tcp, Client};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use nbd::wire::Command;
use nbd::{Export, Server};
use std::sync::Arc;
use std::time::{Duration, Instant};

const DEPTH: u64 = 8;
const DEV: u64 = 64 << 20;

fn bench(c: &mut Criterion) {
    let dev = Arc::new(RamDevice::new(4096, DEV / 4096));
    let h = Server::bind_tcp("127.0.0.1:0", Export::new("", dev.clone()))
        .unwrap()
        .spawn()
        .unwrap();
    let mut client = Client::go(tcp(h.local_addr()), "");
    let mut ratios = Vec::new();
    for size in [4096usize, 1 << 20] {
        let mut g = c.benchmark_group(format!("nbd_{}k", size / 1024));
        g.throughput(Throughput::Bytes(size as u64 * DEPTH));
        g.measurement_time(Duration::from_secs(3));
        g.sample_size(10);
        let data = vec![0x5au8; size];
        let slots = DEV / size as u64;
        for write in [false, true] {
            let op = if write { "write" } else { "read" };
            let mut direct_time = Duration::ZERO;
            let mut direct_n = 0u32;
            g.bench_function(format!("baseline_direct_{op}"), |b| {
                let mut buf = vec![0u8; size];
                let mut i = 0u64;
                b.iter(|| {
                    let t = Instant::now();
                    for _ in 0..DEPTH {
                        let lba = (i % slots) * size as u64 / 4096;
                        i += 1;
                        if write {
                            dev.write_at(lba, &data).unwrap();
                        } else {
                            dev.read_at(lba, &mut buf).unwrap();
                        }
                    }
                    direct_time += t.elapsed();
                    direct_n += 1;
                })
            });
            let mut nbd_time = Duration::ZERO;
            let mut nbd_n = 0u32;
            g.bench_function(format!("nbd_{op}"), |b| {
                let mut i = 0u64;
                b.iter(|| {
                    let t = Instant::now();
                    for _ in 0..DEPTH {
                        let off = (i % slots) * size as u64;
                        i += 1;
                        if write {
                            client.send(Command::Write, 0, off, size as u32, &data);
                        } else {
                            client.send(Command::Read, 0, off, size as u32, &[]);
                        }
                    }
                    for _ in 0..DEPTH {
                        let (_, err, _) = client.recv(if write { 0 } else { size }).unwrap();
                        assert!(err.is_none());
                    }
                    nbd_time += t.elapsed();
                    nbd_n += 1;
                })
            });
            let per = |t: Duration, n: u32| t.as_secs_f64() / f64::from(n.max(1));
            ratios.push(format!(
                "{}k {op}: nbd/direct time ratio {:.1}",
                size / 1024,
                per(nbd_time, nbd_n) / per(direct_time, direct_n)
            ));
        }
        g.finish();
    }
    for r in ratios {
        println!("{r}");
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
