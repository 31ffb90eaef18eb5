//! Every SRP IU of a real Linux ib_srp <-> LIO ib_srpt session (over rxe,
//! RDMA CM) decodes with our parsers and re-emits byte for byte.
//!
//! The IUs were extracted by `testdata/srp/extract.py` from
//! `linux-ib_srp-to-lio-srpt-over-rxe.pcapng` (first 600 frames) and checked
//! against tshark; see the header of the data file.

use srp::wire::{
    BufFormats, DataDesc, DescFormat, Iu, IuType, LoginReq, MultiChannelAction, MultiChannelResult,
    Tag, TaskAttr, LINUX_IMM_DATA_OFFSET,
};
use std::collections::BTreeMap;

const DATA: &str = include_str!("../../../testdata/srp/capture-ib_srp-lio.txt");

fn unhex(s: &str) -> Vec<u8> {
    assert!(s.len() % 2 == 0, "odd hex length");
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

fn records() -> Vec<(String, u32, Vec<u8>)> {
    DATA.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let mut it = l.split_whitespace();
            let kind = it.next().expect("kind").to_string();
            let frame = it.next().expect("frame").parse().expect("frame number");
            let bytes = unhex(it.next().expect("hex"));
            (kind, frame, bytes)
        })
        .collect()
}

#[test]
fn every_captured_iu_decodes_and_reemits_identically() {
    let recs = records();
    let mut counts: BTreeMap<&'static str, usize> = BTreeMap::new();
    let mut imm_data_offset = None;

    for (kind, frame, bytes) in &recs {
        match kind.as_str() {
            "login_req_rdma" => {
                let req =
                    LoginReq::parse_rdma(bytes).unwrap_or_else(|e| panic!("frame {frame}: {e}"));
                let mut out = [0u8; 56];
                req.emit_rdma(&mut out).unwrap();
                assert_eq!(&out[..], &bytes[..], "frame {frame}: login re-emit");
                // The same values in the 64-byte IB form survive a round trip.
                let mut ib = [0u8; 64];
                req.emit(&mut ib).unwrap();
                assert_eq!(LoginReq::parse(&ib), Ok(req));
                assert_eq!(req.tag, Tag(0));
                assert_eq!(req.req_it_iu_len, 8260);
                assert_eq!(req.req_buf_fmt, BufFormats::DIRECT | BufFormats::INDIRECT);
                assert_eq!(req.flags.multichannel(), MultiChannelAction::Single);
                assert!(req.flags.immediate_requested());
                assert_eq!(req.imm_data_offset, LINUX_IMM_DATA_OFFSET);
                assert_eq!(req.initiator_port_id.guid(), 0x5054_00ff_fe99_0003);
                imm_data_offset = Some(req.imm_data_offset);
                *counts.entry("login_req").or_default() += 1;
            }
            "cm_rep" => {
                // CM REP private data: 196 bytes, the IU at the start, zeros after.
                assert_eq!(bytes.len(), 196);
                let iu = Iu::parse(bytes, None).unwrap_or_else(|e| panic!("frame {frame}: {e}"));
                let Iu::LoginRsp(rsp) = iu else {
                    panic!(
                        "frame {frame}: expected SRP_LOGIN_RSP, got {}",
                        iu.iu_type()
                    )
                };
                let out = iu.to_vec().unwrap();
                assert_eq!(out.len(), 52);
                assert_eq!(&out[..], &bytes[..52], "frame {frame}: login rsp re-emit");
                assert!(bytes[52..].iter().all(|&b| b == 0));
                assert_eq!(rsp.req_lim_delta, 128);
                assert_eq!(rsp.max_ti_iu_len, 8260);
                assert!(rsp.flags.immediate_supported());
                assert_eq!(rsp.flags.multichannel(), MultiChannelResult::NoExisting);
                *counts.entry("login_rsp").or_default() += 1;
            }
            "send" => {
                let iu = Iu::parse(bytes, imm_data_offset)
                    .unwrap_or_else(|e| panic!("frame {frame}: {e}"));
                let out = iu.to_vec().unwrap();
                assert_eq!(out, *bytes, "frame {frame}: {} re-emit", iu.iu_type());
                match iu {
                    Iu::Cmd(cmd) => {
                        assert_eq!(cmd.task_attr, TaskAttr::Simple);
                        assert_eq!(cmd.data_out, DataDesc::None, "frame {frame}: no writes");
                        let key = match cmd.data_in.format() {
                            DescFormat::None => "cmd_no_data",
                            DescFormat::Direct => "cmd_data_in_direct",
                            other => panic!("frame {frame}: unexpected data-in {other}"),
                        };
                        *counts.entry(key).or_default() += 1;
                    }
                    Iu::Rsp(rsp) => {
                        let key = if rsp.sense_data.is_some() {
                            assert_eq!(rsp.status, 0x02, "CHECK CONDITION carries sense");
                            assert_eq!(rsp.sense_data.map(<[u8]>::len), Some(96));
                            "rsp_sense"
                        } else {
                            "rsp_plain"
                        };
                        *counts.entry(key).or_default() += 1;
                    }
                    other => panic!("frame {frame}: unexpected {}", other.iu_type()),
                }
            }
            other => panic!("unknown record kind {other}"),
        }
    }

    let expected: BTreeMap<&'static str, usize> = [
        ("login_req", 1),
        ("login_rsp", 1),
        ("cmd_no_data", 2),
        ("cmd_data_in_direct", 80),
        ("rsp_plain", 42),
        ("rsp_sense", 1),
    ]
    .into_iter()
    .collect();
    assert_eq!(counts, expected, "IUs of each kind in the capture");
    assert_eq!(recs.len(), 127);
}

#[test]
fn responses_echo_command_tags() {
    // Every SRP_RSP in the capture answers an SRP_CMD sent before it.
    let mut outstanding = std::collections::HashSet::new();
    let mut answered = 0;
    for (kind, frame, bytes) in records() {
        if kind != "send" {
            continue;
        }
        match Iu::parse(&bytes, Some(LINUX_IMM_DATA_OFFSET)).unwrap() {
            Iu::Cmd(c) => assert!(outstanding.insert(c.tag), "frame {frame}: tag reused"),
            Iu::Rsp(r) => {
                assert!(outstanding.remove(&r.tag), "frame {frame}: unmatched tag");
                answered += 1;
            }
            other => panic!("frame {frame}: {}", other.iu_type()),
        }
    }
    assert_eq!(answered, 43);
    assert_eq!(IuType::Cmd.fixed_len(), Some(48));
}
