//! The core's own ceiling: READ(16)/WRITE(16) through `Target::execute` on
//! nullio and ram, 4 KiB and 1 MiB, 1 and 4 threads (4 KiB on nullio and
//! ram also 8 and 32). Criterion's elem/s is IOPS; a table of IOPS per case
//! (fixed 0.5 s runs) is printed at the end for the issue note. Baseline in the same run: a plain memcpy of the same size, so the
//! core's overhead shows as a ratio. `ram_pi`: ram formatted with type 1
//! protection information, commands with RDPROTECT/WRPROTECT 0 (the target
//! generates, checks and strips PI: the cost of the CRC per block).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use scsi::*;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn cdb16(op: u8, lba: u64, n: u32) -> Vec<u8> {
    let mut c = vec![op, 0];
    c.extend_from_slice(&lba.to_be_bytes());
    c.extend_from_slice(&n.to_be_bytes());
    c.extend_from_slice(&[0, 0]);
    c
}

fn setup(kind: &str) -> (Arc<Target>, Nexus) {
    let size = 64 << 20;
    let backend: Arc<dyn Backend> = match kind {
        "ram" => Arc::new(Ram::new(size)),
        "ram_pi" => Arc::new(Ram::with_pi(size, 4096)),
        _ => Arc::new(NullIo::new(size)),
    };
    let cfg = DeviceConfig {
        block_size: 4096,
        protection: (kind == "ram_pi").then_some(PiType::Type1),
        ..Default::default()
    };
    let t = Target::new();
    let lun = Lun::new(0).unwrap();
    t.add_lun(None, lun, Arc::new(Device::new(cfg, backend).unwrap()));
    let n = Nexus::new("bench", "p");
    t.execute(&n, lun, &[0; 6], &[], 0);
    // Written once, so reads check real PI rather than all-ones escapes.
    let mib = vec![0xa5u8; 1 << 20];
    for k in 0..(size >> 20) {
        let r = t.execute(&n, lun, &cdb16(0x8a, k * 256, 256), &mib, mib.len() as u64);
        assert_eq!(r.status, Status::Good);
    }
    (Arc::new(t), n)
}

fn run(t: &Arc<Target>, n: &Nexus, threads: u64, iters: u64, size: usize, write: bool) -> Duration {
    let blocks = (size / 4096) as u32;
    let per = iters.div_ceil(threads);
    let start = Instant::now();
    std::thread::scope(|s| {
        for k in 0..threads {
            let t = t.clone();
            let n = n.clone();
            s.spawn(move || {
                let data = vec![0x5a; size];
                let lun = Lun::new(0).unwrap();
                for i in 0..per {
                    let lba = (k * 977 + i * blocks as u64) % (16384 - blocks as u64);
                    let r = if write {
                        t.execute(&n, lun, &cdb16(0x8a, lba, blocks), &data, size as u64)
                    } else {
                        t.execute(&n, lun, &cdb16(0x88, lba, blocks), &[], size as u64)
                    };
                    assert_eq!(r.status, Status::Good);
                    std::hint::black_box(r);
                }
            });
        }
    });
    start.elapsed()
}

fn bench(c: &mut Criterion) {
    for size in [4096usize, 1 << 20] {
        let mut g = c.benchmark_group(format!("core_{}k", size / 1024));
        g.throughput(Throughput::Elements(1));
        if size > 4096 {
            g.sample_size(10);
        }
        let src = vec![1u8; size];
        g.bench_function("baseline_memcpy", |b| {
            b.iter(|| {
                let v = src.clone();
                std::hint::black_box(v)
            })
        });
        for name in ["nullio", "ram", "ram_pi"] {
            let (t, n) = setup(name);
            let many: &[u64] = if size == 4096 && name != "ram_pi" {
                &[1, 4, 8, 32]
            } else {
                &[1, 4]
            };
            for &threads in many {
                for write in [false, true] {
                    let id = format!("{name}_{}_{threads}t", if write { "write" } else { "read" });
                    g.bench_with_input(BenchmarkId::from_parameter(id), &threads, |b, &th| {
                        b.iter_custom(|iters| run(&t, &n, th, iters, size, write))
                    });
                }
            }
        }
        g.finish();
    }
}

/// IOPS of each 4 KiB nullio/ram case over a fixed wall time, printed
/// as a table (criterion's elem/s says the same per case, scattered).
fn iops_table(_: &mut Criterion) {
    println!("\nIOPS, 4 KiB, Target::execute (0.5 s per case)");
    println!("{:<8} {:<6} {:>8} {:>12}", "store", "op", "threads", "IOPS");
    for name in ["nullio", "ram"] {
        let (t, n) = setup(name);
        for write in [false, true] {
            for threads in [1u64, 4, 8, 32] {
                // Calibrate a batch, then run batches for 0.5 s.
                let mut batch = 1024 * threads;
                while run(&t, &n, threads, batch, 4096, write) < Duration::from_millis(20) {
                    batch *= 2;
                }
                let (mut ops, mut took) = (0u64, Duration::ZERO);
                while took < Duration::from_millis(500) {
                    took += run(&t, &n, threads, batch, 4096, write);
                    ops += batch.div_ceil(threads) * threads;
                }
                let op = if write { "write" } else { "read" };
                let iops = ops as f64 / took.as_secs_f64();
                println!("{name:<8} {op:<6} {threads:>8} {iops:>12.0}");
            }
        }
    }
}

criterion_group!(benches, bench, iops_table);
criterion_main!(benches);
