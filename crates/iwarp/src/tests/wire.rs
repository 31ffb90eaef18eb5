//! Byte vectors for every header, parsed and re-emitted, and the tables.

use crate::ddp::{self, DdpPacket, Placement, SegmentRepr};
use crate::mpa::{self, FrameError, FrameKind, FrameRepr, IrdOrd};
use crate::rdmap::{Opcode, ReadRequestRepr};
use crate::terminate::{Layer, TermCause, TermCode, TerminateError, TerminateRepr};
use crate::{Msn, STag};

#[test]
fn crc32c_known_vectors() {
    // RFC 3720 B.4 (iSCSI), the vectors MPA's CRC shares.
    assert_eq!(mpa::crc32c(&[0u8; 32]), 0x8a91_36aa);
    assert_eq!(mpa::crc32c(&[0xffu8; 32]), 0x62a8_ab43);
    let inc: Vec<u8> = (0..32).collect();
    assert_eq!(mpa::crc32c(&inc), 0x46dd_794e);
    let dec: Vec<u8> = (0..32).rev().collect();
    assert_eq!(mpa::crc32c(&dec), 0x113f_db5c);
    // The customary check value of CRC-32C.
    assert_eq!(mpa::crc32c(b"123456789"), 0xe306_9283);
}

#[test]
fn fpdu_bytes() {
    // A 15-byte ULPDU: length 2 + 15 = 17, so 3 pad bytes, then the CRC
    // least significant byte first.
    let ulpdu: Vec<u8> = (1..=15).collect();
    let mut out = Vec::new();
    mpa::emit_fpdu(&ulpdu, true, &mut out);
    assert_eq!(out.len(), mpa::fpdu_len(15));
    assert_eq!(out.len(), 24);
    assert_eq!(&out[..2], &[0x00, 0x0f]); // ULPDU Length 15
    assert_eq!(&out[2..17], &ulpdu[..]);
    assert_eq!(&out[17..20], &[0, 0, 0]); // pad
    let crc = mpa::crc32c(&out[..20]);
    assert_eq!(&out[20..], &crc.to_le_bytes());
    // CRC off: the field is zero.
    let mut off = Vec::new();
    mpa::emit_fpdu(&ulpdu, false, &mut off);
    assert_eq!(&off[20..], &[0, 0, 0, 0]);
    // Pad for each residue.
    assert_eq!([14, 15, 16, 17].map(mpa::pad_len), [0, 3, 2, 1]);
}

#[test]
fn mulpdu_from_mtu() {
    // 1500 - 52 = EMSS 1448; 1448 - 6 = 1442 and the FPDU is exactly EMSS.
    assert_eq!(mpa::mulpdu(1500, mpa::TCP_IPV4_OVERHEAD), 1442);
    assert_eq!(mpa::fpdu_len(1442), 1448);
    // 9000 - 72 = 8928 (IPv6).
    assert_eq!(mpa::mulpdu(9000, mpa::TCP_IPV6_OVERHEAD), 8922);
    // EMSS 1447 (3 mod 4): 1447 - 6 - 3 = 1438, FPDU 1444 <= 1447.
    assert_eq!(mpa::mulpdu(1499, mpa::TCP_IPV4_OVERHEAD), 1438);
    assert!(mpa::fpdu_len(1438) <= 1447);
    // Every MTU gives an FPDU that fits one segment.
    for mtu in 60..3000 {
        let m = mpa::mulpdu(mtu, mpa::TCP_IPV4_OVERHEAD);
        assert!(
            mpa::fpdu_len(usize::from(m)) as u32 <= mtu - mpa::TCP_IPV4_OVERHEAD,
            "mtu {mtu}"
        );
    }
    // Absurd MTUs stay in range (and Connection::new refuses the small).
    assert_eq!(mpa::mulpdu(0, 52), 0);
    assert_eq!(mpa::mulpdu(u32::MAX, 52), u16::MAX);
}

const V2_REQUEST: [u8; 27] = [
    b'M', b'P', b'A', b' ', b'I', b'D', b' ', b'R', b'e', b'q', b' ', b'F', b'r', b'a', b'm', b'e',
    0x50, // M=0 C=1 R=0 H=1 (RFC 6581 enhanced)
    0x02, // revision 2
    0x00, 0x07, // PD_Length 7: 4 of IRD/ORD + 3 of ULP data
    0x80, 0x10, // P=1 (peer-to-peer), IRD 16
    0x40, 0x08, // read RTR, ORD 8
    0xaa, 0xbb, 0xcc, // private data
];

#[test]
fn mpa_request_v2_vector() {
    let (f, used) = FrameRepr::parse(&V2_REQUEST, FrameKind::Request).unwrap();
    assert_eq!(used, V2_REQUEST.len());
    assert_eq!(
        f,
        FrameRepr {
            kind: FrameKind::Request,
            markers: false,
            crc: true,
            reject: false,
            revision: 2,
            ird_ord: Some(IrdOrd {
                ird: 16,
                ord: 8,
                peer_to_peer: true,
                zero_length_rtr: false,
                write_rtr: false,
                read_rtr: true
            }),
            private_data: vec![0xaa, 0xbb, 0xcc],
        }
    );
    assert_eq!(f.buffer_len(), V2_REQUEST.len());
    let mut out = Vec::new();
    f.emit(&mut out);
    assert_eq!(out, V2_REQUEST);
    // The same bytes are not a reply.
    assert_eq!(
        FrameRepr::parse(&V2_REQUEST, FrameKind::Reply),
        Err(FrameError::BadKey {
            expected: FrameKind::Reply
        })
    );
}

#[test]
fn mpa_reply_v1_reject_vector() {
    let bytes = [
        b'M', b'P', b'A', b' ', b'I', b'D', b' ', b'R', b'e', b'p', b' ', b'F', b'r', b'a', b'm',
        b'e', 0xa0, // M=1 C=0 R=1
        0x01, // revision 1
        0x00, 0x02, // PD_Length 2
        0x12, 0x34,
    ];
    let (f, _) = FrameRepr::parse(&bytes, FrameKind::Reply).unwrap();
    assert!(f.markers && f.reject && !f.crc);
    assert_eq!(
        (f.revision, f.ird_ord, &f.private_data[..]),
        (1, None, &[0x12, 0x34][..])
    );
    let mut out = Vec::new();
    f.emit(&mut out);
    assert_eq!(out, bytes);
}

#[test]
fn mpa_frame_refusals() {
    let mut b = V2_REQUEST.to_vec();
    // Every prefix is incomplete, never an error or a frame.
    for n in 0..b.len() {
        assert!(
            matches!(
                FrameRepr::parse(&b[..n], FrameKind::Request),
                Err(FrameError::Incomplete(_))
            ),
            "{n}"
        );
    }
    b[17] = 3;
    assert_eq!(
        FrameRepr::parse(&b, FrameKind::Request),
        Err(FrameError::Revision(3))
    );
    b[17] = 2;
    b[18..20].copy_from_slice(&513u16.to_be_bytes());
    assert_eq!(
        FrameRepr::parse(&b, FrameKind::Request),
        Err(FrameError::PrivateDataTooLong(513))
    );
    b[18..20].copy_from_slice(&2u16.to_be_bytes());
    assert_eq!(
        FrameRepr::parse(&b, FrameKind::Request),
        Err(FrameError::NoIrdOrd(2))
    );
    b[0] = b'm';
    assert!(matches!(
        FrameRepr::parse(&b, FrameKind::Request),
        Err(FrameError::BadKey { .. })
    ));
}

#[test]
fn ddp_tagged_vector() {
    let bytes = [
        0xc1, // T=1 L=1 DV=1
        0x40, // RV=1, opcode 0 (RDMA Write)
        0x11, 0x22, 0x33, 0x44, // STag
        0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x10, // TO 0x1_0000_0010
        0xde, 0xad, // payload
    ];
    let p = DdpPacket::new_checked(&bytes[..]).unwrap();
    let s = SegmentRepr::parse(&p).unwrap();
    assert_eq!(
        s,
        SegmentRepr {
            last: true,
            opcode: Opcode::RdmaWrite,
            placement: Placement::Tagged {
                stag: STag(0x1122_3344),
                to: 0x1_0000_0010
            }
        }
    );
    assert_eq!(p.payload(), &[0xde, 0xad]);
    let mut out = Vec::new();
    s.emit(&mut out);
    assert_eq!(out.len(), s.buffer_len());
    assert_eq!(out, bytes[..ddp::TAGGED_HEADER_LEN]);
}

#[test]
fn ddp_untagged_vector() {
    let bytes = [
        0x01, // T=0 L=0 DV=1
        0x46, // RV=1, opcode 6 (Send with SE and Invalidate)
        0x00, 0x00, 0xbe, 0xef, // Invalidate STag
        0x00, 0x00, 0x00, 0x00, // QN 0
        0x00, 0x00, 0x00, 0x05, // MSN 5
        0x00, 0x00, 0x10, 0x00, // MO 4096
    ];
    let p = DdpPacket::new_checked(&bytes[..]).unwrap();
    let s = SegmentRepr::parse(&p).unwrap();
    assert_eq!(
        s,
        SegmentRepr {
            last: false,
            opcode: Opcode::SendSeInvalidate,
            placement: Placement::Untagged {
                inv_stag: STag(0xbeef),
                qn: 0,
                msn: Msn(5),
                mo: 4096
            }
        }
    );
    assert!(p.payload().is_empty());
    let mut out = Vec::new();
    s.emit(&mut out);
    assert_eq!(out, bytes);
    // Too short for an untagged header: framing lost.
    assert_eq!(
        DdpPacket::new_checked(&bytes[..17]).err(),
        Some(TermCause::MpaFraming)
    );
}

#[test]
fn ddp_header_checks() {
    let good = SegmentRepr {
        last: true,
        opcode: Opcode::Send,
        placement: Placement::Untagged {
            inv_stag: STag(0),
            qn: 0,
            msn: Msn(1),
            mo: 0,
        },
    };
    let mut b = Vec::new();
    good.emit(&mut b);
    let parse = |b: &[u8]| SegmentRepr::parse(&DdpPacket::new_checked(b).unwrap());
    let mut v = b.clone();
    v[0] = (v[0] & !3) | 2; // DDP version 2
    assert_eq!(parse(&v), Err(TermCause::DdpUntaggedVersion));
    let mut v = b.clone();
    v[1] = (v[1] & 0x3f) | 0x80; // RDMAP version 2
    assert_eq!(parse(&v), Err(TermCause::RdmapVersion));
    let mut v = b.clone();
    v[1] = 0x40; // RV=1, opcode 0 (RDMA Write) with T=0
    assert_eq!(parse(&v), Err(TermCause::RdmapUnexpectedOpcode));
    let mut v = b.clone();
    v[1] = 0x40 | 0x9; // undefined opcode
    assert_eq!(parse(&v), Err(TermCause::RdmapUnexpectedOpcode));
    let mut v = b.clone();
    v[0] |= ddp::FLAG_TAGGED; // Send with T=1
    v[0] &= !3; // and DDP version 0: the tagged version error
    assert_eq!(parse(&v), Err(TermCause::DdpTaggedVersion));
}

#[test]
fn segmentation() {
    let segs: Vec<_> = ddp::segments(100, 18, 58).collect();
    assert_eq!(segs, vec![(0, 40, false), (40, 40, false), (80, 20, true)]);
    assert_eq!(
        ddp::segments(0, 14, 1442).collect::<Vec<_>>(),
        vec![(0, 0, true)]
    );
    assert_eq!(
        ddp::segments(40, 18, 58).collect::<Vec<_>>(),
        vec![(0, 40, true)]
    );
}

#[test]
fn opcode_table() {
    for v in 0..16u8 {
        let o = Opcode::from(v);
        assert_eq!(u8::from(o), v);
        assert_eq!(o.info().is_some(), v <= 7, "{v}");
    }
    assert_eq!(Opcode::ALL.len(), 8);
    // RFC 5040 4.3: Write and Read Response are the tagged ones.
    let tagged: Vec<_> = Opcode::ALL
        .iter()
        .filter(|o| o.info().unwrap().tagged)
        .collect();
    assert_eq!(tagged, [&Opcode::RdmaWrite, &Opcode::ReadResponse]);
    for (se, inv) in [(false, false), (false, true), (true, false), (true, true)] {
        let i = Opcode::send(se, inv).info().unwrap();
        assert_eq!((i.solicited, i.invalidate, i.queue), (se, inv, 0));
    }
    assert_eq!(Opcode::from(0xa).to_string(), "unknown RDMAP opcode 0xa");
}

#[test]
fn read_request_vector() {
    let bytes = [
        0x00, 0x00, 0x00, 0x07, // sink STag
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x20, 0x00, // sink TO
        0x00, 0x01, 0x00, 0x00, // size 65536
        0x00, 0x00, 0x00, 0x09, // source STag
        0xff, 0xff, 0xff, 0xff, 0x00, 0x00, 0x00, 0x00, // source TO
    ];
    let r = ReadRequestRepr::parse(&bytes).unwrap();
    assert_eq!(
        r,
        ReadRequestRepr {
            sink_stag: STag(7),
            sink_to: 0x2000,
            size: 65536,
            src_stag: STag(9),
            src_to: 0xffff_ffff_0000_0000
        }
    );
    let mut out = Vec::new();
    r.emit(&mut out);
    assert_eq!(out, bytes);
    assert_eq!(ReadRequestRepr::parse(&bytes[..27]), None);
}

#[test]
fn term_cause_table() {
    // One row per triple, every row found again by its triple.
    for (i, a) in TermCause::ALL.iter().enumerate() {
        assert_eq!(TermCause::from_code(a.code()), Some(*a));
        for b in &TermCause::ALL[i + 1..] {
            assert_ne!(a.code(), b.code(), "{a:?} and {b:?}");
        }
    }
    // The codes Linux siw sends for the same conditions.
    assert_eq!(
        TermCause::MpaCrc.code(),
        TermCode {
            layer: 2,
            etype: 0,
            ecode: 2
        }
    );
    assert_eq!(
        TermCause::DdpInvalidStag.code(),
        TermCode {
            layer: 1,
            etype: 1,
            ecode: 0
        }
    );
    assert_eq!(
        TermCause::DdpNoBuffer.code(),
        TermCode {
            layer: 1,
            etype: 2,
            ecode: 2
        }
    );
    assert_eq!(
        TermCause::RdmapAccessRights.code(),
        TermCode {
            layer: 0,
            etype: 1,
            ecode: 2
        }
    );
    assert_eq!(
        TermCause::RdmapUnexpectedOpcode.code(),
        TermCode {
            layer: 0,
            etype: 2,
            ecode: 6
        }
    );
    assert_eq!(TermCause::MpaCrc.code().layer(), Layer::Llp);
    assert_eq!(
        TermCause::DdpTooLong.to_string(),
        "DDP untagged buffer error: DDP message too long for available buffer (layer 1 type 0x2 code 0x05)"
    );
    assert_eq!(
        TermCode {
            layer: 3,
            etype: 1,
            ecode: 7
        }
        .to_string(),
        "unknown TERMINATE cause (layer 3 type 0x1 code 0x07)"
    );
}

#[test]
fn terminate_vectors() {
    let bytes = [
        0x11, // layer 1 (DDP), type 1 (tagged buffer)
        0x01, // code 1: base or bounds
        0xc0, // M=1 D=1 R=0
        0x00, // reserved
        0x00, 0x20, // DDP Segment Length 32
        0xc1, 0x40, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0x10, 0x00, // the tagged header
    ];
    let t = TerminateRepr::parse(&bytes).unwrap();
    assert_eq!(t.code, TermCause::DdpBaseBounds.code());
    assert_eq!(t.segment_len, Some(32));
    assert_eq!(t.ddp_header.as_deref(), Some(&bytes[6..]));
    assert_eq!(t.rdma_header, None);
    let mut out = Vec::new();
    t.emit(&mut out);
    assert_eq!(out.len(), t.buffer_len());
    assert_eq!(out, bytes);
    for n in 0..bytes.len() {
        assert!(
            matches!(
                TerminateRepr::parse(&bytes[..n]),
                Err(TerminateError::Truncated { .. })
            ),
            "{n}"
        );
    }
    // Bare control; and one with an RDMA header.
    let bare = TerminateRepr {
        code: TermCause::MpaCrc.code(),
        segment_len: None,
        ddp_header: None,
        rdma_header: None,
    };
    let mut out = Vec::new();
    bare.emit(&mut out);
    assert_eq!(out, [0x20, 0x02, 0x00, 0x00]);
    let rr = TerminateRepr {
        rdma_header: Some([7; 28]),
        ..bare
    };
    let mut out = Vec::new();
    rr.emit(&mut out);
    assert_eq!(out[2], 0x20);
    assert_eq!(TerminateRepr::parse(&out).unwrap(), rr);
}
