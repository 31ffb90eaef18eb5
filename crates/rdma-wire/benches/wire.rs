//! Header parse and emit, and the ICRC over 64 B / 1 KiB / 4 KiB packets,
//! against baselines measured in the same run: plain `crc32fast::hash` and
//! a memcpy of the same bytes. After criterion's report, a short summary
//! prints the ratios.

use std::hint::black_box;
use std::net::Ipv4Addr;
use std::time::Instant as StdInstant;

use criterion::{BenchmarkId, Criterion, Throughput};
use rdma_types::{Pkey, Psn, Qpn, Rkey};
use rdma_wire::*;

fn roce(payload: &[u8], opcode: Opcode) -> RoceRepr<'_> {
    let reth = Some(RethRepr {
        va: 0x7f00_0000_1000,
        rkey: Rkey(0x1234),
        dma_len: payload.len() as u32,
    });
    let ext = match opcode {
        Opcode::RcWriteOnly => ExtHeaders {
            reth,
            ..ExtHeaders::default()
        },
        _ => ExtHeaders::default(),
    };
    let mut bth = BthRepr::new(
        opcode,
        Pkey::DEFAULT,
        Qpn::new(0x11).unwrap(),
        Psn::new(0xF7_4835),
    );
    bth.mig_req = true;
    bth.ack_req = true;
    RoceRepr {
        ip: IpRepr::V4(Ipv4Repr {
            src: Ipv4Addr::new(10, 99, 0, 3),
            dst: Ipv4Addr::new(10, 99, 0, 2),
            tos: 0,
            ident: 0,
            dont_frag: true,
            ttl: 64,
            protocol: 17,
            payload_len: 0,
        }),
        udp: UdpRepr {
            src_port: 0xC011,
            dst_port: ROCEV2_UDP_PORT,
            checksum: UdpChecksum::None,
        },
        ib: IbRepr::new(bth, ext, payload),
    }
}

/// A whole IPv4 RoCEv2 packet of exactly `len` bytes (RC WRITE Only).
fn packet_of_len(len: usize) -> Vec<u8> {
    // IPv4 20 + UDP 8 + BTH 12 + RETH 16 + ICRC 4 = 60 bytes of headers.
    let payload = vec![0x5Au8; len - 60];
    let r = roce(&payload, Opcode::RcWriteOnly);
    let mut buf = vec![0u8; r.buffer_len()];
    r.emit(&mut buf).unwrap();
    assert_eq!(buf.len(), len);
    buf
}

fn headers(c: &mut Criterion) {
    let pkt = packet_of_len(1024);
    let udp_payload = &pkt[28..];
    let mut g = c.benchmark_group("headers");
    g.throughput(Throughput::Elements(1));
    g.bench_function("parse_bth", |b| {
        b.iter(|| BthRepr::parse(&BthPacket::new_checked(black_box(udp_payload)).unwrap()))
    });
    g.bench_function("parse_ib_bth_reth_payload", |b| {
        b.iter(|| IbRepr::parse(black_box(udp_payload)).unwrap())
    });
    g.bench_function("parse_ip_udp_ib_with_icrc_check", |b| {
        b.iter(|| RoceRepr::parse(black_box(&pkt)).unwrap())
    });
    let repr = IbRepr::parse(udp_payload).unwrap();
    let mut hdr_only = repr;
    hdr_only.payload = &[];
    let mut out = vec![0u8; 64];
    g.bench_function("emit_ib_headers", |b| {
        b.iter(|| black_box(&hdr_only).emit(&mut out).unwrap())
    });
    let whole = RoceRepr::parse(&pkt).unwrap();
    let mut out = vec![0u8; pkt.len()];
    g.bench_function("emit_ip_udp_ib_with_icrc_1k", |b| {
        b.iter(|| black_box(&whole).emit(&mut out).unwrap())
    });
    g.finish();
}

fn icrc_vs_baselines(c: &mut Criterion) {
    let mut g = c.benchmark_group("icrc");
    for len in [64usize, 1024, 4096] {
        let pkt = packet_of_len(len);
        let mut dst = vec![0u8; len];
        g.throughput(Throughput::Bytes(len as u64));
        g.bench_with_input(BenchmarkId::new("icrc", len), &pkt, |b, p| {
            b.iter(|| icrc::compute_ip_packet(black_box(p)).unwrap())
        });
        g.bench_with_input(BenchmarkId::new("crc32fast_baseline", len), &pkt, |b, p| {
            b.iter(|| crc32fast::hash(black_box(p)))
        });
        g.bench_with_input(BenchmarkId::new("memcpy_baseline", len), &pkt, |b, p| {
            b.iter(|| {
                dst.copy_from_slice(black_box(p));
                black_box(&dst);
            })
        });
    }
    g.finish();
}

/// Nanoseconds per call, best of 5 rounds.
fn ns_per(mut f: impl FnMut(), iters: u32) -> f64 {
    (0..5)
        .map(|_| {
            let t = StdInstant::now();
            for _ in 0..iters {
                f();
            }
            t.elapsed().as_nanos() as f64 / f64::from(iters)
        })
        .fold(f64::INFINITY, f64::min)
}

fn summary() {
    println!("\nsummary (best of 5 rounds, same run):");
    for len in [64usize, 1024, 4096] {
        let pkt = packet_of_len(len);
        let mut dst = vec![0u8; len];
        let iters = (4_000_000 / len as u32).max(10_000);
        let icrc = ns_per(
            || {
                let _ = black_box(icrc::compute_ip_packet(black_box(&pkt)));
            },
            iters,
        );
        let crc = ns_per(
            || {
                black_box(crc32fast::hash(black_box(&pkt)));
            },
            iters,
        );
        let copy = ns_per(
            || {
                dst.copy_from_slice(black_box(&pkt));
                black_box(&dst);
            },
            iters,
        );
        let gbs = |ns: f64| len as f64 / ns;
        println!(
            "  {len:>4} B: icrc {:.2} GB/s, crc32fast {:.2} GB/s (icrc/crc32fast time {:.2}x), memcpy {:.2} GB/s (icrc/memcpy time {:.1}x)",
            gbs(icrc),
            gbs(crc),
            icrc / crc,
            gbs(copy),
            icrc / copy
        );
    }
    let pkt = packet_of_len(1024);
    let r = RoceRepr::parse(&pkt).unwrap();
    let ib = &pkt[28..pkt.len() - 4];
    let carried = icrc::trailer(&pkt).unwrap();
    let socket = ns_per(
        || {
            let _ = black_box(icrc::compute(black_box(&r.ip), &r.udp, black_box(ib)));
        },
        200_000,
    );
    let recover = ns_per(
        || {
            black_box(icrc::recover_ipv4_ident(
                black_box(&r.ip),
                &r.udp,
                black_box(ib),
                carried,
            ));
        },
        20_000,
    );
    println!(
        "  1024 B, socket path: icrc::compute {socket:.1} ns; recover_ipv4_ident {recover:.1} ns"
    );
    let parse = ns_per(
        || {
            let _ = black_box(IbRepr::parse(black_box(&pkt[28..])));
        },
        1_000_000,
    );
    println!("  IbRepr::parse (BTH+RETH): {parse:.1} ns/packet");
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    headers(&mut c);
    icrc_vs_baselines(&mut c);
    c.final_summary();
    summary();
}
