//! Two soft RoCE nodes on loopback addresses exchange RDMA traffic through
//! real UDP sockets, with and without injected faults; a capture of the
//! traffic is checked with our parser (every ICRC) and, when installed,
//! with tshark.

use rdma_sim::FaultConfig;
use rdma_types::{Instant, Lkey, Mtu, Qpn, Rkey, WcStatus};
use roce::{QpConfig, RecvWqe, SendOp, SendWqe, Sge};
use softroce::{FlatMemory, Node, NodeConfig, QpHandle};
use std::time::{Duration, Instant as StdInstant};

const KEY: u32 = 7;

/// A region under key 7, filled by `fill`.
fn region(len: usize, fill: impl Fn(usize) -> u8) -> FlatMemory {
    let m = FlatMemory::new(KEY, len);
    m.with(|b| b.iter_mut().enumerate().for_each(|(i, x)| *x = fill(i)));
    m
}

fn bytes(m: &FlatMemory, off: usize, len: usize) -> Vec<u8> {
    m.with(|b| b[off..off + len].to_vec())
}

const LEN: usize = 4 << 20;

struct Pair {
    a: Node,
    b: Node,
    qa: QpHandle,
    qb: QpHandle,
    ma: FlatMemory,
    mb: FlatMemory,
    epoch: StdInstant,
}

fn pair(
    a_ip: &str,
    b_ip: &str,
    faults: Option<FaultConfig>,
    capture: Option<std::path::PathBuf>,
) -> Pair {
    let mut ca = NodeConfig::new(format!("{a_ip}:0").parse().unwrap());
    ca.faults = faults.clone();
    ca.capture = capture;
    let mut cb = NodeConfig::new(format!("{b_ip}:0").parse().unwrap());
    cb.faults = faults.map(|f| FaultConfig {
        seed: f.seed ^ 0x55,
        ..f
    });
    Pair::from_nodes(Node::bind(ca).unwrap(), Node::bind(cb).unwrap())
}

impl Pair {
    /// Connects an RC QP on each node to the other's.
    fn from_nodes(mut a: Node, mut b: Node) -> Pair {
        let ma = region(LEN, |i| (i * 7 % 251) as u8);
        let mb = region(LEN, |_| 0);
        let mut cfg = QpConfig::rc(Qpn::new(0).unwrap(), Qpn::new(0).unwrap());
        cfg.pmtu = Mtu::Mtu1024;
        cfg.timeout = 8; // 1 ms: loss recovers quickly on loopback
        let qa = a.create_qp(cfg.clone(), Box::new(ma.clone()));
        let qb = b.create_qp(cfg, Box::new(mb.clone()));
        Node::connect_pair(&mut a, qa, &mut b, qb);
        Pair {
            a,
            b,
            qa,
            qb,
            ma,
            mb,
            epoch: StdInstant::now(),
        }
    }

    fn now(&self) -> Instant {
        Instant::from_std(self.epoch, StdInstant::now())
    }

    /// Drives both nodes until `n` completions arrived at A (bounded: 60 s).
    fn run_until_completions(&mut self, n: usize) -> Vec<roce::Completion> {
        let mut wcs = Vec::new();
        let deadline = StdInstant::now() + Duration::from_secs(60);
        while wcs.len() < n && StdInstant::now() < deadline {
            let now = self.now();
            let busy = self.a.poll(now) | self.b.poll(now);
            while let Some(c) = self.a.poll_completion(self.qa) {
                wcs.push(c);
            }
            if !busy {
                // Idle: sleep in the kernel until traffic or a timer.
                let _ = self.a.wait(Duration::from_micros(200));
            }
        }
        wcs
    }
}

fn sge(addr: u64, len: u32) -> Vec<Sge> {
    vec![Sge {
        addr,
        len,
        lkey: Lkey(KEY),
    }]
}

fn write_read_send_roundtrip(p: &mut Pair, chunk: u32, rounds: u64) {
    let mut posted = 0;
    for i in 0..rounds {
        let off = (i * u64::from(chunk)) % (LEN as u64 / 2);
        p.a.qp_mut(p.qa).unwrap().post_send(SendWqe::new(
            i * 2,
            SendOp::Write {
                raddr: off,
                rkey: Rkey(KEY),
            },
            sge(off, chunk),
        ));
        // Read it back into the upper half of A's region.
        let back = LEN as u64 / 2 + off;
        p.a.qp_mut(p.qa).unwrap().post_send(SendWqe::new(
            i * 2 + 1,
            SendOp::Read {
                raddr: off,
                rkey: Rkey(KEY),
            },
            sge(back, chunk),
        ));
        posted += 2;
    }
    let wcs = p.run_until_completions(posted);
    assert_eq!(wcs.len(), posted, "every WR completed");
    assert!(
        wcs.iter().all(|c| c.status == WcStatus::Success),
        "{:?}",
        wcs.iter().find(|c| c.status != WcStatus::Success)
    );
    let ids: Vec<u64> = wcs.iter().map(|c| c.wr_id).collect();
    assert_eq!(ids, (0..posted as u64).collect::<Vec<_>>(), "in order");
    for i in 0..rounds {
        let off = ((i * u64::from(chunk)) % (LEN as u64 / 2)) as usize;
        let sent = bytes(&p.ma, off, chunk as usize);
        assert_eq!(
            bytes(&p.mb, off, chunk as usize),
            sent,
            "WRITE landed at {off}"
        );
        assert_eq!(
            bytes(&p.ma, LEN / 2 + off, chunk as usize),
            sent,
            "READ brought it back for {off}"
        );
    }
}

#[test]
fn rc_traffic_over_real_udp_sockets() {
    let mut p = pair("127.0.0.1", "127.0.0.1", None, None);
    write_read_send_roundtrip(&mut p, 65536, 16);
    let (sa, sb) = (p.a.stats(), p.b.stats());
    assert_eq!(sa.rx_bad_icrc + sb.rx_bad_icrc, 0);
    // A: 1024 WRITE packets and 16 READ requests; B: 1024 READ response
    // packets plus ACKs.
    assert_eq!(sa.tx_packets, 16 * 64 + 16, "{sa:?}");
    assert!(sb.tx_packets > 16 * 64, "{sb:?}");
    assert_eq!(
        p.a.qp_mut(p.qa).unwrap().counters().timeouts,
        0,
        "no loss on loopback"
    );
}

/// The segments of a GSO send leave with IPv4 Identifications 0, 1, 2, …
/// and the sender patches each ICRC to match. A receiver that gets them
/// coalesced (GRO) knows each one's place and checks it at once; one that
/// gets them one by one (GRO off, as Linux rxe does) sees the real
/// Identifications, which only the ICRC reveals: recovering them proves the
/// patched ICRCs are the ones the wire needs. Messages of 64 KiB and of
/// 65,001 bytes: a send's last segment is then shorter, with a pad.
#[test]
fn gso_segments_carry_the_icrc_of_their_ipv4_identification() {
    for (gro, chunk) in [(true, 65536), (false, 65536), (true, 65001), (false, 65001)] {
        let mut ca = NodeConfig::new("127.0.0.1:0".parse().unwrap());
        ca.gso = true;
        let mut cb = NodeConfig::new("127.0.0.1:0".parse().unwrap());
        cb.gro = gro;
        let mut p = Pair::from_nodes(Node::bind(ca).unwrap(), Node::bind(cb).unwrap());
        write_read_send_roundtrip(&mut p, chunk, 8);
        let (sa, sb) = (p.a.stats(), p.b.stats());
        println!("gro {gro}: sender {sa:?}\nreceiver {sb:?}");
        assert_eq!(sb.rx_bad_icrc + sa.rx_bad_icrc, 0);
        if sa.tx_gso_sends == 0 {
            rdma_testkit::need::WHOLE.skip("UDP GSO: no send was segmented", "Linux 4.18 or later");
            return;
        }
        if gro && sb.rx_gro_buffers > 0 {
            assert_eq!(sb.rx_ipv4_id_recovered, 0, "{sb:?}");
        }
        if !gro {
            assert_eq!(sb.rx_gro_buffers, 0);
            // Every segment after the first of each send had a non-zero ID.
            assert!(sb.rx_ipv4_id_recovered >= sa.tx_gso_sends, "{sb:?}");
        }
    }
}

#[test]
fn rc_traffic_survives_one_percent_loss_and_reordering() {
    let faults = FaultConfig {
        seed: 3,
        loss: 0.01,
        duplicate: 0.005,
        reorder: 0.01,
        corrupt: 0.002,
        ..FaultConfig::default()
    };
    let mut p = pair("127.0.0.1", "127.0.0.1", Some(faults), None);
    write_read_send_roundtrip(&mut p, 65536, 16);
    let c = p.a.qp_mut(p.qa).unwrap().counters();
    assert!(c.retransmits > 0, "loss forced retransmissions: {c:?}");
    assert!(
        p.a.stats().rx_bad_icrc + p.b.stats().rx_bad_icrc > 0,
        "corruption caught by the ICRC"
    );
}

#[test]
fn send_recv_and_garbage_do_not_disturb_a_live_qp() {
    let mut p = pair("127.0.0.1", "127.0.0.1", None, None);
    p.b.qp_mut(p.qb).unwrap().post_recv(RecvWqe {
        wr_id: 9,
        sges: sge(0, 4096),
    });
    // Garbage from a stranger socket to B: short, random, bad ICRC, unknown QP.
    let stranger = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    for junk in [vec![], vec![0u8; 3], vec![0xffu8; 64], {
        let mut v = vec![0x04u8, 0, 0xff, 0xff, 0, 0, 0, 0x11, 0, 0, 0, 0];
        v.extend_from_slice(&[0; 8]);
        v
    }] {
        stranger.send_to(&junk, p.b.local_addr()).unwrap();
    }
    p.a.qp_mut(p.qa)
        .unwrap()
        .post_send(SendWqe::new(1, SendOp::Send, sge(100, 3000)));
    let wcs = p.run_until_completions(1);
    assert_eq!(wcs[0].status, WcStatus::Success);
    let deadline = StdInstant::now() + Duration::from_secs(10);
    let mut recv = None;
    while recv.is_none() && StdInstant::now() < deadline {
        let now = p.now();
        p.a.poll(now);
        p.b.poll(now);
        recv = p.b.poll_completion(p.qb);
    }
    let r = recv.expect("receive completion");
    assert_eq!((r.wr_id, r.byte_len), (9, 3000));
    assert_eq!(bytes(&p.mb, 0, 3000), bytes(&p.ma, 100, 3000));
    let s = p.b.stats();
    assert!(
        s.rx_malformed + s.rx_bad_icrc >= 3,
        "garbage dropped and counted: {s:?}"
    );
}

#[test]
fn capture_decodes_and_every_icrc_is_ours() {
    let dir = std::env::temp_dir().join(format!("softroce-cap-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cap = dir.join("a.pcap");
    let mut p = pair("127.0.0.1", "127.0.0.1", None, Some(cap.clone()));
    p.b.qp_mut(p.qb).unwrap().post_recv(RecvWqe {
        wr_id: 1,
        sges: sge(0, 8192),
    });
    p.a.qp_mut(p.qa)
        .unwrap()
        .post_send(SendWqe::new(1, SendOp::Send, sge(0, 2500)));
    p.a.qp_mut(p.qa).unwrap().post_send(SendWqe::new(
        2,
        SendOp::Write {
            raddr: 8192,
            rkey: Rkey(KEY),
        },
        sge(0, 1500),
    ));
    p.a.qp_mut(p.qa).unwrap().post_send(SendWqe::new(
        3,
        SendOp::Read {
            raddr: 8192,
            rkey: Rkey(KEY),
        },
        sge(65536, 1500),
    ));
    assert_eq!(p.run_until_completions(3).len(), 3);
    let ports = [p.a.local_addr().port(), p.b.local_addr().port()];
    drop(p);
    let bytes = std::fs::read(&cap).unwrap();
    // Our own reading: every record is an IPv4 RoCEv2 packet with a valid ICRC.
    let (_, records) = rdma_wire::pcap::read(&bytes).unwrap();
    let ops: Vec<(u8, u32)> = records
        .iter()
        .map(|r| {
            let r = rdma_wire::RoceRepr::parse(r.data)
                .expect("captured packet parses with a good ICRC");
            (r.ib.bth.opcode.code(), r.ib.bth.psn.value())
        })
        .collect();
    // A: SEND First/Middle/Last (3 pkts), WRITE First/Last (2), READ req (1);
    // B: ACKs for the SEND and WRITE (coalesced or not), READ resp First/Last (2).
    let sent: Vec<u8> = ops.iter().map(|o| o.0).filter(|&c| c <= 0x0c).collect();
    assert_eq!(
        sent,
        vec![0x00, 0x01, 0x02, 0x06, 0x08, 0x0c],
        "requests in order"
    );
    assert!(
        ops.iter().any(|o| o.0 == 0x0d) && ops.iter().any(|o| o.0 == 0x0f),
        "READ response first/last"
    );
    assert!(ops.iter().any(|o| o.0 == 0x11), "an ACK");
    // tshark, when installed: decodes every packet as InfiniBand with our
    // opcode, nothing malformed, no expert warnings.
    if let Some(rows) = rdma_testkit::tshark_fields(
        "capture_decodes_and_every_icrc_is_ours",
        &cap,
        &ports,
        &["infiniband.bth.opcode"],
    ) {
        let opcodes: Vec<String> = rows.iter().map(|r| r[0].clone()).collect();
        let ours: Vec<String> = ops.iter().map(|o| o.0.to_string()).collect();
        assert_eq!(opcodes, ours, "tshark decodes every BTH opcode as we do");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn rc_traffic_over_ipv6() {
    let (a, b) = match (
        Node::bind(NodeConfig::new("[::1]:0".parse().unwrap())),
        Node::bind(NodeConfig::new("[::1]:0".parse().unwrap())),
    ) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(e), _) | (_, Err(e)) => {
            rdma_testkit::need::WHOLE.skip(
                &format!("IPv6 loopback: bind [::1]: {e}"),
                "sysctl net.ipv6.conf.lo.disable_ipv6=0",
            );
            return;
        }
    };
    let mut p = Pair::from_nodes(a, b);
    write_read_send_roundtrip(&mut p, 20_000, 8);
    // IPv6 has no Identification field: nothing to recover, nothing bad.
    let (sa, sb) = (p.a.stats(), p.b.stats());
    assert_eq!(sa.rx_bad_icrc + sb.rx_bad_icrc + sa.rx_ipv4_id_recovered, 0);
    assert!(sb.rx_delivered > 8, "{sb:?}");
}

#[test]
fn qp_numbers_start_where_the_config_says() {
    let addr = "127.0.0.1:0".parse().unwrap();
    let mut n = Node::bind(NodeConfig::new(addr)).unwrap();
    assert_eq!(n.reserve_qpn().value(), 0x11);
    let cfg = NodeConfig::new(addr).with_random_first_qpn();
    assert!(
        (0x100..0x80_0000).contains(&cfg.first_qpn),
        "{:#x}",
        cfg.first_qpn
    );
    let first = cfg.first_qpn;
    let mut n = Node::bind(cfg).unwrap();
    assert_eq!(n.reserve_qpn().value(), first);
    assert_eq!(n.reserve_qpn().value(), first + 1);
    // Two processes (here: two draws) rarely start at the same number.
    let draws: std::collections::HashSet<u32> = (0..8)
        .map(|_| NodeConfig::new(addr).with_random_first_qpn().first_qpn)
        .collect();
    assert!(draws.len() > 1, "{draws:?}");
}

#[test]
fn qp_numbers_stay_in_the_configured_range_and_wrap_inside_it() {
    let mut cfg = NodeConfig::new("127.0.0.1:0".parse().unwrap());
    cfg.qpns = roce_udp::block_qpns(3);
    let cfg = cfg.with_random_first_qpn();
    assert!(
        (0x3_0100..0x3_8000).contains(&cfg.first_qpn),
        "{:#x}",
        cfg.first_qpn
    );
    let mut cfg = NodeConfig::new("127.0.0.1:0".parse().unwrap());
    cfg.qpns = 0x3_0000..0x3_0004;
    cfg.first_qpn = 0x3_0002;
    let mut n = Node::bind(cfg).unwrap();
    let got: Vec<u32> = (0..4).map(|_| n.reserve_qpn().value()).collect();
    assert_eq!(got, vec![0x3_0002, 0x3_0003, 0x3_0000, 0x3_0001]);
    n.release_qpn(Qpn::from_bits(0x3_0000));
    assert_eq!(n.reserve_qpn().value(), 0x3_0000, "the one given back");
}

/// A node on a member of a shared port (`roce_udp::PortGroup`) that
/// numbers its QPs in the member's block gets its traffic, and the group's
/// owner none of it.
#[test]
fn rc_traffic_through_a_lent_member_of_a_shared_port() {
    let mut group = roce_udp::PortGroup::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let shared = group.local_addr();
    let mut own = NodeConfig::new(shared);
    own.socket = Some(std::sync::Arc::new(group.owner().unwrap()));
    let mut owner = Node::bind(own).unwrap();
    let (block, fd) = group.lend().unwrap();
    let mut cb = NodeConfig::new(shared);
    cb.socket = Some(std::sync::Arc::new(fd));
    cb.qpns = roce_udp::block_qpns(block);
    let cb = cb.with_random_first_qpn();
    let b = Node::bind(cb).unwrap();
    assert_eq!(b.local_addr(), shared);
    let a = Node::bind(NodeConfig::new("127.0.0.1:0".parse().unwrap())).unwrap();
    let mut p = Pair::from_nodes(a, b);
    assert_eq!(roce_udp::qpn_block(p.qb.0.value()), block);
    write_read_send_roundtrip(&mut p, 4096, 64);
    let now = p.now();
    owner.poll(now);
    assert_eq!(owner.stats().rx_datagrams, 0, "{:?}", owner.stats());
    assert!(p.b.stats().rx_datagrams >= 128, "{:?}", p.b.stats());
}

/// The datagrams leave in pieces (headers, the payload buffer, pad and
/// ICRC gathered by the kernel): what a plain UDP socket receives must be,
/// byte for byte, the UDP payload of the packet the capture framed in one
/// buffer, for every pad count and header list.
#[test]
fn gathered_datagrams_are_the_captured_bytes() {
    let dir = std::env::temp_dir().join(format!("softroce-wire-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cap = dir.join("a.pcap");
    let mut ca = NodeConfig::new("127.0.160.10:0".parse().unwrap());
    ca.capture = Some(cap.clone());
    ca.gso = false; // GSO segments after the first carry another ICRC
    let mut a = Node::bind(ca).unwrap();
    let mut peer = roce_udp::RoceSocket::bind("127.0.160.11:0".parse().unwrap()).unwrap();
    let ma = region(1 << 16, |i| (i * 13 % 253) as u8);
    let mut cfg = QpConfig::rc(Qpn::new(0).unwrap(), Qpn::new(0x77).unwrap());
    cfg.pmtu = Mtu::Mtu1024;
    let qa = a.create_qp(cfg, Box::new(ma));
    a.set_remote(qa, peer.local_addr());
    a.qp_mut(qa).unwrap().set_rts();
    let qp = a.qp_mut(qa).unwrap();
    // Pads 3, 2, 1, 0; a two-packet SEND whose last has pad 3; immediate
    // data; a WRITE (RETH) and a READ request (RETH, no payload).
    for (i, len) in [1u32, 2, 3, 4, 1025].into_iter().enumerate() {
        qp.post_send(SendWqe::new(i as u64, SendOp::Send, sge(7 * i as u64, len)));
    }
    qp.post_send(SendWqe::new(5, SendOp::SendImm(0xABCD), sge(3, 9)));
    let write = SendOp::Write {
        raddr: 0x1000,
        rkey: Rkey(3),
    };
    qp.post_send(SendWqe::new(6, write, sge(11, 6)));
    let read = SendOp::Read {
        raddr: 0x2000,
        rkey: Rkey(3),
    };
    qp.post_send(SendWqe::new(7, read, sge(100, 64)));
    const PACKETS: usize = 9;
    let epoch = StdInstant::now();
    let mut got: Vec<Vec<u8>> = Vec::new();
    let deadline = StdInstant::now() + Duration::from_secs(10);
    while got.len() < PACKETS && StdInstant::now() < deadline {
        a.poll(Instant::from_std(epoch, StdInstant::now()));
        let _ = peer.wait(None, Duration::from_millis(10));
        peer.recv_batch(64, |_, d| got.push(d.to_vec()));
    }
    assert!(got.len() >= PACKETS, "only {} datagrams arrived", got.len());
    drop(a);
    let bytes = std::fs::read(&cap).unwrap();
    let (_, records) = rdma_wire::pcap::read(&bytes).unwrap();
    let framed: Vec<&[u8]> = records.iter().map(|r| &r.data[28..]).collect();
    assert!(framed.len() >= PACKETS);
    let pads: Vec<u8> = framed[..PACKETS].iter().map(|d| (d[1] >> 4) & 3).collect();
    assert_eq!(
        pads,
        [3, 2, 1, 0, 0, 3, 3, 2, 0],
        "every pad count is covered"
    );
    for (k, (wire, one_buffer)) in got.iter().zip(&framed).take(PACKETS).enumerate() {
        assert_eq!(&wire[..], *one_buffer, "datagram {k}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
