//! Runs the body of the `iu_parse` fuzz target (`fuzz/iu_body.rs`) over
//! deterministic mutations of real and synthesized IUs, so CI exercises it
//! without nightly or cargo-fuzz.

use rdma_types::Rkey;
use srp::wire::*;
use std::collections::BTreeMap;

include!("../fuzz/iu_body.rs");

const CAPTURE: &str = include_str!("../../../testdata/srp/capture-ib_srp-lio.txt");

/// xorshift64*: small, deterministic, good enough to pick mutations.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

/// Seeds: every IU of the capture and one of each IU type built here.
fn seeds() -> Vec<Vec<u8>> {
    let mut v: Vec<Vec<u8>> = CAPTURE
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| unhex(l.split_whitespace().nth(2).expect("hex")))
        .collect();
    let tag = Tag(0x42);
    let lun = Lun([0, 1, 0, 0, 0, 0, 0, 0]);
    let sense = [0x70, 0, 6, 0, 0, 0, 0, 10, 0, 0, 0, 0, 0x29, 0];
    let data = [0xa5u8; 100];
    let cdb32: Vec<u8> = (0..32).collect();
    let mut list = Vec::new();
    let d = DirectBuf {
        va: 0x1000,
        key: Rkey(7),
        len: 512,
    };
    DescList::encode(&[d, d, d], &mut list);
    let indirect = IndirectBuf {
        table: DirectBuf {
            va: 0x8000,
            key: Rkey(9),
            len: 64,
        },
        total_len: 1536,
        descs: DescList::new(&list).unwrap(),
    };
    let ius = [
        Iu::LoginReq(LoginReq {
            tag,
            req_it_iu_len: 8260,
            req_buf_fmt: BufFormats::DIRECT | BufFormats::INDIRECT,
            flags: LoginReqFlags::new(MultiChannelAction::Multi, true),
            imm_data_offset: 68,
            initiator_port_id: PortId([1; 16]),
            target_port_id: PortId([2; 16]),
        }),
        Iu::LoginRej(LoginRej {
            reason: LoginRejReason::InsufficientResources,
            tag,
            buf_fmt: BufFormats::DIRECT,
        }),
        Iu::Cmd(Cmd {
            sol_not: 0,
            tag,
            lun,
            task_attr: TaskAttr::Ordered,
            cdb: &cdb32,
            data_out: DataDesc::Indirect(indirect),
            data_in: DataDesc::Direct(d),
        }),
        Iu::Cmd(Cmd {
            sol_not: 0,
            tag,
            lun,
            task_attr: TaskAttr::Simple,
            cdb: &[0x2a, 0, 0, 0, 0, 0, 0, 0, 1, 0],
            data_out: DataDesc::Immediate {
                offset: LINUX_IMM_DATA_OFFSET,
                data: &data,
            },
            data_in: DataDesc::None,
        }),
        Iu::Rsp(Rsp {
            sol_not: 0,
            req_lim_delta: 1,
            tag,
            flags: RspFlags(RspFlags::DIUNDER),
            status: 2,
            data_out_res_cnt: 0,
            data_in_res_cnt: 4,
            response_data: Some(&[0, 0, 0, 5]),
            sense_data: Some(&sense),
        }),
        Iu::TskMgmt(TskMgmt {
            sol_not: 0,
            tag,
            lun,
            func: TmFunc::LogicalUnitReset,
            task_tag: Tag(0),
        }),
        Iu::ILogout(ILogout { tag }),
        Iu::TLogout(TLogout {
            sol_not: 1,
            reason: TLogoutReason::InvalidIuType,
            tag,
        }),
        Iu::CredReq(CredReq {
            sol_not: 0,
            req_lim_delta: 5,
            tag,
        }),
        Iu::CredRsp(CredRsp { tag }),
        Iu::AerReq(AerReq {
            sol_not: 0,
            req_lim_delta: 0,
            tag,
            lun,
            sense_data: &sense,
        }),
        Iu::AerRsp(AerRsp { tag }),
    ];
    for iu in ius {
        v.push(iu.to_vec().unwrap());
    }
    v
}

const INTERESTING: [u8; 10] = [0x00, 0x01, 0x02, 0x03, 0x04, 0x10, 0x7f, 0x80, 0xfc, 0xff];

fn mutate(rng: &mut Rng, seed: &[u8]) -> Vec<u8> {
    let mut v = seed.to_vec();
    for _ in 0..1 + rng.below(4) {
        match rng.below(6) {
            0 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] ^= 1 << rng.below(8);
            }
            1 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] = INTERESTING[rng.below(INTERESTING.len())];
            }
            2 => {
                let n = rng.below(v.len() + 1);
                v.truncate(n);
            }
            3 => {
                for _ in 0..rng.below(40) {
                    v.push(rng.next() as u8);
                }
            }
            4 if v.len() >= 4 => {
                // A 32-bit length or count field set to an edge value.
                let i = rng.below(v.len() - 3);
                let val: u32 = [0, 1, 16, 0xffff, 0x7fff_ffff, u32::MAX][rng.below(6)];
                v[i..i + 4].copy_from_slice(&val.to_be_bytes());
            }
            _ if !v.is_empty() => {
                // The opcode or the SRP_CMD format/count bytes.
                let i = [0usize, 5, 6, 7, 31][rng.below(5)].min(v.len() - 1);
                v[i] = rng.next() as u8;
            }
            _ => {}
        }
    }
    v
}

#[test]
fn mutated_ius_never_panic_and_round_trip() {
    let mut rng = Rng(0x5eed_5eed_1234_5678);
    let seeds = seeds();
    let mut parsed: BTreeMap<String, usize> = BTreeMap::new();
    let mut total = 0;
    for seed in &seeds {
        for round in 0..60 {
            let mut input = vec![(rng.next() as u8) & !3 | (round % 4) as u8];
            input.extend(mutate(&mut rng, seed));
            if let Some(t) = check_iu_bytes(&input) {
                *parsed.entry(t.name().to_string()).or_default() += 1;
            }
            total += 1;
        }
    }
    // Pure noise too.
    for _ in 0..2000 {
        let n = rng.below(120);
        let input: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
        let _ = check_iu_bytes(&input);
        total += 1;
    }
    eprintln!("{total} inputs, parsed: {parsed:?}");
    assert!(total > 9000, "ran {total} inputs");
    // Mutations must not all be rejected: every IU type parsed some of them.
    for t in [
        "SRP_LOGIN_REQ",
        "SRP_LOGIN_REJ",
        "SRP_LOGIN_RSP",
        "SRP_CMD",
        "SRP_RSP",
        "SRP_TSK_MGMT",
        "SRP_I_LOGOUT",
        "SRP_T_LOGOUT",
        "SRP_CRED_REQ",
        "SRP_CRED_RSP",
        "SRP_AER_REQ",
        "SRP_AER_RSP",
    ] {
        assert!(
            parsed.get(t).copied().unwrap_or(0) > 0,
            "{t} never parsed: {parsed:?}"
        );
    }
}

#[test]
fn every_truncation_of_every_seed_is_an_error_or_shorter_iu() {
    // Cutting an IU anywhere inside its emitted length must be rejected.
    for seed in seeds() {
        let Ok(iu) = Iu::parse(&seed, Some(LINUX_IMM_DATA_OFFSET)) else {
            continue;
        };
        let len = iu.buffer_len();
        for cut in 0..len {
            assert!(
                Iu::parse(&seed[..cut], Some(LINUX_IMM_DATA_OFFSET)).is_err(),
                "{} cut to {cut} of {len} bytes parsed",
                iu.iu_type()
            );
        }
    }
}

/// The `iu_parse` target's committed seeds and regression inputs
/// (`fuzz/seeds/iu_parse`, `fuzz/regressions/iu_parse`).
#[test]
fn iu_parse_replays_its_committed_inputs() {
    rdma_testkit::fuzz::replay(env!("CARGO_MANIFEST_DIR"), "iu_parse", |data| {
        let _ = check_iu_bytes(data);
    });
}
