//! Packets built by our emitters, written with our pcap writer, read back
//! by tshark: every record must decode as RoCEv2/InfiniBand with the
//! opcode we wrote and no malformed-packet mark. Needs tshark
//! (`rdma_testkit::need`: a skip, or a failure under `CI=true`).

use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;
use std::process::Command;

use rdma_types::{Instant, Pkey, Psn, Qkey, Qpn, Rkey};
use rdma_wire::ethernet::EtherType;
use rdma_wire::pcap::{LinkType, PcapWriter};
use rdma_wire::*;

use rdma_testkit::TSHARK;

fn bth(opcode: Opcode, psn: u32) -> BthRepr {
    let mut b = BthRepr::new(
        opcode,
        Pkey::DEFAULT,
        Qpn::new(0x12).unwrap(),
        Psn::new(psn),
    );
    b.mig_req = true;
    b.ack_req = true;
    b
}

/// One packet of every header combination the opcode table has.
fn packets(payload: &[u8]) -> Vec<IbRepr<'_>> {
    let reth = Some(RethRepr {
        va: 0x1000,
        rkey: Rkey(0x1234),
        dma_len: 300,
    });
    let ack = |s: u8| {
        Some(AethRepr {
            syndrome: Syndrome::from_byte(s),
            msn: 5,
        })
    };
    let atomic = Some(AtomicEthRepr {
        va: 0x2000,
        rkey: Rkey(7),
        swap_add: 1,
        compare: 2,
    });
    let none = ExtHeaders::default();
    let mut v = vec![
        IbRepr::new(bth(Opcode::RcSendOnly, 1), none, &payload[..13]),
        IbRepr::new(bth(Opcode::RcSendFirst, 2), none, &payload[..256]),
        IbRepr::new(
            bth(Opcode::RcWriteFirst, 3),
            ExtHeaders { reth, ..none },
            &payload[..256],
        ),
        IbRepr::new(bth(Opcode::RcWriteMiddle, 4), none, &payload[..256]),
        IbRepr::new(
            bth(Opcode::RcWriteOnlyImm, 5),
            ExtHeaders {
                reth,
                imm_dt: Some(ImmDtRepr { imm: 0xABCD }),
                ..none
            },
            &payload[..44],
        ),
        IbRepr::new(
            bth(Opcode::RcReadRequest, 6),
            ExtHeaders { reth, ..none },
            &[],
        ),
        IbRepr::new(
            bth(Opcode::RcReadResponseOnly, 6),
            ExtHeaders {
                aeth: ack(0x1f),
                ..none
            },
            &payload[..7],
        ),
        IbRepr::new(bth(Opcode::RcReadResponseMiddle, 7), none, &payload[..256]),
        IbRepr::new(
            bth(Opcode::RcAcknowledge, 7),
            ExtHeaders {
                aeth: ack(0x1f),
                ..none
            },
            &[],
        ),
        IbRepr::new(
            bth(Opcode::RcAcknowledge, 8),
            ExtHeaders {
                aeth: ack(0x60),
                ..none
            },
            &[],
        ),
        IbRepr::new(
            bth(Opcode::RcAcknowledge, 9),
            ExtHeaders {
                aeth: ack(0x2e),
                ..none
            },
            &[],
        ),
        IbRepr::new(
            bth(Opcode::RcCompareSwap, 10),
            ExtHeaders {
                atomic_eth: atomic,
                ..none
            },
            &[],
        ),
        IbRepr::new(
            bth(Opcode::RcFetchAdd, 11),
            ExtHeaders {
                atomic_eth: atomic,
                ..none
            },
            &[],
        ),
        IbRepr::new(
            bth(Opcode::RcAtomicAcknowledge, 11),
            ExtHeaders {
                aeth: ack(0x1f),
                atomic_ack_eth: Some(AtomicAckEthRepr { orig_data: 9 }),
                ..none
            },
            &[],
        ),
        IbRepr::new(
            bth(Opcode::RcSendLastInv, 12),
            ExtHeaders {
                ieth: Some(IethRepr { rkey: Rkey(0x77) }),
                ..none
            },
            &payload[..3],
        ),
        IbRepr::new(
            bth(Opcode::UcWriteOnly, 13),
            ExtHeaders { reth, ..none },
            &payload[..300],
        ),
        IbRepr::new(
            bth(Opcode::UdSendOnlyImm, 14),
            ExtHeaders {
                deth: Some(DethRepr {
                    qkey: Qkey(0x1111_1111),
                    src_qp: Qpn::new(0x99).unwrap(),
                }),
                imm_dt: Some(ImmDtRepr { imm: 1 }),
                ..none
            },
            &payload[..1],
        ),
    ];
    let mut cnp = bth(Opcode::Cnp, 0);
    cnp.becn = true;
    v.push(IbRepr::new(cnp, none, &[0u8; 16]));
    v
}

fn temp_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("rdma-wire-{}-{name}.pcap", std::process::id()))
}

/// Writes every packet over IPv4 and IPv6, in Ethernet or raw-IP records;
/// returns the file and the opcodes in record order.
fn write_capture(link: LinkType) -> (PathBuf, Vec<(u8, u32)>) {
    let payload: Vec<u8> = (0..400u32).map(|i| i as u8).collect();
    let path = temp_path(if link == LinkType::Raw { "raw" } else { "eth" });
    let file = std::fs::File::create(&path).unwrap();
    let mut w = PcapWriter::new(std::io::BufWriter::new(file), link).unwrap();
    let v4 = IpRepr::V4(Ipv4Repr {
        src: Ipv4Addr::new(127, 0, 0, 1),
        dst: Ipv4Addr::new(127, 0, 0, 2),
        tos: 0,
        ident: 0,
        dont_frag: true,
        ttl: 64,
        protocol: 17,
        payload_len: 0,
    });
    let v6 = IpRepr::V6(Ipv6Repr {
        src: Ipv6Addr::LOCALHOST,
        dst: "fd00::2".parse().unwrap(),
        traffic_class: 0,
        flow_label: 0,
        next_header: 17,
        hop_limit: 64,
        payload_len: 0,
    });
    let mut ops = Vec::new();
    let mut t = 0;
    for ip in [v4, v6] {
        for ib in packets(&payload) {
            let udp = UdpRepr {
                src_port: 0xC012,
                dst_port: ROCEV2_UDP_PORT,
                checksum: UdpChecksum::None,
            };
            let roce = RoceRepr { ip, udp, ib };
            let mut buf = vec![0u8; 14 + roce.buffer_len()];
            let n = match link {
                LinkType::Raw => roce.emit(&mut buf).unwrap(),
                LinkType::Ethernet => {
                    let eth = EthernetRepr {
                        dst: [2, 0, 0, 0, 0, 2],
                        src: [2, 0, 0, 0, 0, 1],
                        ethertype: if matches!(ip, IpRepr::V4(_)) {
                            EtherType::Ipv4
                        } else {
                            EtherType::Ipv6
                        },
                    };
                    RoceFrame {
                        eth,
                        roce,
                        trailer: &[],
                    }
                    .emit(&mut buf)
                    .unwrap()
                }
            };
            t += 1000;
            w.write_packet(Instant::from_micros(t), &buf[..n]).unwrap();
            ops.push((ib.bth.opcode.code(), ib.bth.psn.value()));
        }
    }
    w.into_inner().unwrap();
    (path, ops)
}

/// Dissectors tshark tries heuristically on IB payloads (RPC-over-RDMA,
/// iSER, SMB Direct...): our payloads are arbitrary bytes, so those
/// protocols are turned off; the IB headers are what is checked. EtherType
/// is also in that list but is needed for the Ethernet records.
fn payload_heuristics() -> Vec<String> {
    let list = |what: &str| {
        let out = Command::new(TSHARK)
            .args(["-G", what])
            .output()
            .expect("run tshark -G");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    let protocols: std::collections::HashSet<String> = list("protocols")
        .iter()
        .filter_map(|l| l.split('\t').nth(2))
        .map(str::to_owned)
        .collect();
    list("heuristic-decodes")
        .iter()
        .filter_map(|l| l.strip_prefix("infiniband.payload\t"))
        .filter_map(|l| l.split('\t').next())
        .filter(|p| *p != "ethertype" && protocols.contains(*p))
        .map(str::to_owned)
        .collect()
}

fn tshark(path: &PathBuf, fields: &[&str]) -> Vec<Vec<String>> {
    let mut cmd = Command::new(TSHARK);
    cmd.arg("-r")
        .arg(path)
        .args(["-T", "fields", "-E", "separator=/t"]);
    for h in payload_heuristics() {
        cmd.args(["--disable-protocol", &h]);
    }
    for f in fields {
        cmd.args(["-e", f]);
    }
    let out = cmd.output().expect("run tshark");
    assert!(
        out.status.success(),
        "tshark failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| l.split('\t').map(str::to_owned).collect())
        .collect()
}

#[test]
fn tshark_decodes_our_captures_as_infiniband() {
    if !rdma_testkit::need::tool(TSHARK) {
        return;
    }
    for link in [LinkType::Ethernet, LinkType::Raw] {
        let (path, ops) = write_capture(link);
        let rows = tshark(
            &path,
            &[
                "infiniband.bth.opcode",
                "_ws.malformed",
                "infiniband.bth.psn",
            ],
        );
        std::fs::remove_file(&path).ok();
        assert_eq!(
            rows.len(),
            ops.len(),
            "{link:?}: one decoded row per record"
        );
        for (i, (row, (op, psn))) in rows.iter().zip(&ops).enumerate() {
            assert_eq!(
                row[0],
                op.to_string(),
                "{link:?} record {}: BTH opcode as tshark reads it",
                i + 1
            );
            assert_eq!(
                row[2],
                psn.to_string(),
                "{link:?} record {}: PSN as tshark reads it",
                i + 1
            );
            assert!(
                row[1].is_empty(),
                "{link:?} record {}: tshark says malformed: {row:?}",
                i + 1
            );
        }
    }
}
