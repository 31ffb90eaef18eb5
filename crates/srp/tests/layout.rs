//! The IU layouts match Linux `include/scsi/srp.h` (written from SRP r16a):
//! each repr is emitted with a distinct value in every field and each value
//! is looked for at the offset and width the C structure gives it. Sizes are
//! the `sizeof` of the packed structures.

use rdma_types::Rkey;
use srp::wire::*;

/// (field name in srp.h, byte offset, width) -> expected big-endian value.
fn check(iu: &str, buf: &[u8], fields: &[(&str, usize, usize, u64)]) {
    for &(name, off, width, want) in fields {
        let got = buf[off..off + width]
            .iter()
            .fold(0u64, |acc, &b| (acc << 8) | u64::from(b));
        assert_eq!(
            got, want,
            "{iu}.{name} at offset {off} (width {width}): got {got:#x}, want {want:#x}"
        );
    }
}

/// Tag bytes 0x11..0x18 on the wire (opaque; read back as they were written).
const TAG: Tag = Tag::from_bytes([0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18]);
const TAG_WIRE: u64 = 0x1112_1314_1516_1718;
const LUN: Lun = Lun([0xa1, 0xa2, 0xa3, 0xa4, 0xa5, 0xa6, 0xa7, 0xa8]);
const LUN_WIRE: u64 = 0xa1a2_a3a4_a5a6_a7a8;

fn port(seed: u8) -> PortId {
    let mut b = [0u8; 16];
    for (i, x) in b.iter_mut().enumerate() {
        *x = seed + i as u8;
    }
    PortId(b)
}

#[test]
fn sizes_match_srp_h() {
    assert_eq!(LOGIN_REQ_LEN, 64); // sizeof(struct srp_login_req)
    assert_eq!(LOGIN_REQ_RDMA_LEN, 56); // sizeof(struct srp_login_req_rdma)
    assert_eq!(LOGIN_RSP_LEN, 52); // packed srp_login_rsp
    assert_eq!(LOGIN_REJ_LEN, 32);
    assert_eq!(TSK_MGMT_LEN, 48);
    assert_eq!(CMD_FIXED_LEN, 48);
    assert_eq!(RSP_FIXED_LEN, 36); // packed srp_rsp
    assert_eq!(AER_REQ_FIXED_LEN, 36); // packed srp_aer_req
    assert_eq!(SMALL_IU_LEN, 16); // i_logout, t_logout, cred_req/rsp, aer_rsp
    assert_eq!(DIRECT_BUF_LEN, 16); // srp_direct_buf
    assert_eq!(INDIRECT_BUF_HEADER_LEN, 20); // packed srp_indirect_buf
    assert_eq!(IMM_BUF_LEN, 4); // srp_imm_buf
    assert_eq!(LINUX_IMM_DATA_OFFSET, 68); // ib_srp SRP_IMM_DATA_OFFSET
                                           // The one IU table agrees with the constants above.
    for (t, len) in [
        (IuType::LoginReq, LOGIN_REQ_LEN),
        (IuType::LoginRsp, LOGIN_RSP_LEN),
        (IuType::LoginRej, LOGIN_REJ_LEN),
        (IuType::TskMgmt, TSK_MGMT_LEN),
        (IuType::Cmd, CMD_FIXED_LEN),
        (IuType::Rsp, RSP_FIXED_LEN),
        (IuType::AerReq, AER_REQ_FIXED_LEN),
        (IuType::ILogout, SMALL_IU_LEN),
        (IuType::TLogout, SMALL_IU_LEN),
        (IuType::CredReq, SMALL_IU_LEN),
        (IuType::CredRsp, SMALL_IU_LEN),
        (IuType::AerRsp, SMALL_IU_LEN),
    ] {
        assert_eq!(t.fixed_len(), Some(len), "{t}");
    }
    // Opcodes (srp.h enum).
    let ops = [
        (IuType::LoginReq, 0x00),
        (IuType::TskMgmt, 0x01),
        (IuType::Cmd, 0x02),
        (IuType::ILogout, 0x03),
        (IuType::LoginRsp, 0xc0),
        (IuType::Rsp, 0xc1),
        (IuType::LoginRej, 0xc2),
        (IuType::TLogout, 0x80),
        (IuType::CredReq, 0x81),
        (IuType::AerReq, 0x82),
        (IuType::CredRsp, 0x41),
        (IuType::AerRsp, 0x42),
    ];
    for (t, op) in ops {
        assert_eq!(u8::from(t), op, "{t}");
    }
}

#[test]
fn login_req_both_forms() {
    let req = LoginReq {
        tag: TAG,
        req_it_iu_len: 0x2122_2324,
        req_buf_fmt: BufFormats(0x3132),
        flags: LoginReqFlags(0x81),
        imm_data_offset: 0x4142,
        initiator_port_id: port(0x50),
        target_port_id: port(0x70),
    };
    let mut ib = [0xffu8; 64];
    req.emit(&mut ib).unwrap();
    check(
        "srp_login_req",
        &ib,
        &[
            ("opcode", 0, 1, 0),
            ("reserved1", 1, 7, 0),
            ("tag", 8, 8, TAG_WIRE),
            ("req_it_iu_len", 16, 4, 0x2122_2324),
            ("reserved2", 20, 4, 0),
            ("req_buf_fmt", 24, 2, 0x3132),
            ("req_flags", 26, 1, 0x81),
            ("reserved3", 27, 1, 0),
            ("imm_data_offset", 28, 2, 0x4142),
            ("reserved4", 30, 2, 0),
            ("initiator_port_id[0..8]", 32, 8, 0x5051_5253_5455_5657),
            ("initiator_port_id[8..16]", 40, 8, 0x5859_5a5b_5c5d_5e5f),
            ("target_port_id[0..8]", 48, 8, 0x7071_7273_7475_7677),
            ("target_port_id[8..16]", 56, 8, 0x7879_7a7b_7c7d_7e7f),
        ],
    );
    let mut rdma = [0xffu8; 56];
    req.emit_rdma(&mut rdma).unwrap();
    check(
        "srp_login_req_rdma",
        &rdma,
        &[
            ("tag", 0, 8, TAG_WIRE),
            ("req_buf_fmt", 8, 2, 0x3132),
            ("req_flags", 10, 1, 0x81),
            ("opcode", 11, 1, 0),
            ("req_it_iu_len", 12, 4, 0x2122_2324),
            ("initiator_port_id[0..8]", 16, 8, 0x5051_5253_5455_5657),
            ("initiator_port_id[8..16]", 24, 8, 0x5859_5a5b_5c5d_5e5f),
            ("target_port_id[0..8]", 32, 8, 0x7071_7273_7475_7677),
            ("target_port_id[8..16]", 40, 8, 0x7879_7a7b_7c7d_7e7f),
            ("imm_data_offset", 48, 2, 0x4142),
            ("reserved", 50, 6, 0),
        ],
    );
    assert_eq!(LoginReq::parse(&ib), Ok(req));
    assert_eq!(LoginReq::parse_rdma(&rdma), Ok(req));
}

#[test]
fn login_rsp_and_rej() {
    let rsp = LoginRsp {
        req_lim_delta: 0x0102_0304,
        tag: TAG,
        max_it_iu_len: 0x2122_2324,
        max_ti_iu_len: 0x3132_3334,
        buf_fmt: BufFormats(0x4142),
        flags: LoginRspFlags(0x82),
    };
    let mut b = [0xffu8; 52];
    rsp.emit(&mut b).unwrap();
    check(
        "srp_login_rsp",
        &b,
        &[
            ("opcode", 0, 1, 0xc0),
            ("reserved1", 1, 3, 0),
            ("req_lim_delta", 4, 4, 0x0102_0304),
            ("tag", 8, 8, TAG_WIRE),
            ("max_it_iu_len", 16, 4, 0x2122_2324),
            ("max_ti_iu_len", 20, 4, 0x3132_3334),
            ("buf_fmt", 24, 2, 0x4142),
            ("rsp_flags", 26, 1, 0x82),
            ("reserved2[0..8]", 27, 8, 0),
            ("reserved2[8..16]", 35, 8, 0),
            ("reserved2[16..25]", 43, 8, 0),
            ("reserved2[24]", 51, 1, 0),
        ],
    );
    let rej = LoginRej {
        reason: LoginRejReason::ChannelLimitReached,
        tag: TAG,
        buf_fmt: BufFormats(0x4142),
    };
    let mut b = [0xffu8; 32];
    rej.emit(&mut b).unwrap();
    check(
        "srp_login_rej",
        &b,
        &[
            ("opcode", 0, 1, 0xc2),
            ("reserved1", 1, 3, 0),
            ("reason", 4, 4, 0x0001_0006),
            ("tag", 8, 8, TAG_WIRE),
            ("reserved2", 16, 8, 0),
            ("buf_fmt", 24, 2, 0x4142),
            ("reserved3", 26, 6, 0),
        ],
    );
}

#[test]
fn cmd_tsk_mgmt_and_descriptors() {
    let cdb: Vec<u8> = (0xc0..0xd0).collect();
    let cmd = Cmd {
        sol_not: 0x06,
        tag: TAG,
        lun: LUN,
        task_attr: TaskAttr::HeadOfQueue,
        cdb: &cdb,
        data_out: DataDesc::Direct(DirectBuf {
            va: 0x0102_0304_0506_0708,
            key: Rkey(0x1112_1314),
            len: 0x2122_2324,
        }),
        data_in: DataDesc::None,
    };
    let mut b = vec![0xffu8; cmd.buffer_len()];
    cmd.emit(&mut b).unwrap();
    assert_eq!(b.len(), 64);
    check(
        "srp_cmd",
        &b,
        &[
            ("opcode", 0, 1, 0x02),
            ("sol_not", 1, 1, 0x06),
            ("reserved1", 2, 3, 0),
            ("buf_fmt", 5, 1, 0x10),
            ("data_out_desc_cnt", 6, 1, 0),
            ("data_in_desc_cnt", 7, 1, 0),
            ("tag", 8, 8, TAG_WIRE),
            ("reserved2", 16, 4, 0),
            ("lun", 20, 8, LUN_WIRE),
            ("reserved3", 28, 1, 0),
            ("task_attr", 29, 1, 1),
            ("reserved4", 30, 1, 0),
            ("add_cdb_len", 31, 1, 0),
            ("cdb[0..8]", 32, 8, 0xc0c1_c2c3_c4c5_c6c7),
            ("cdb[8..16]", 40, 8, 0xc8c9_cacb_cccd_cecf),
            ("srp_direct_buf.va", 48, 8, 0x0102_0304_0506_0708),
            ("srp_direct_buf.key", 56, 4, 0x1112_1314),
            ("srp_direct_buf.len", 60, 4, 0x2122_2324),
        ],
    );

    let tm = TskMgmt {
        sol_not: 0x04,
        tag: TAG,
        lun: LUN,
        func: TmFunc::ClearAca,
        task_tag: Tag::from_bytes([0x31, 0x32, 0x33, 0x34, 0x35, 0x36, 0x37, 0x38]),
    };
    let mut b = [0xffu8; 48];
    tm.emit(&mut b).unwrap();
    check(
        "srp_tsk_mgmt",
        &b,
        &[
            ("opcode", 0, 1, 0x01),
            ("sol_not", 1, 1, 0x04),
            ("reserved1", 2, 6, 0),
            ("tag", 8, 8, TAG_WIRE),
            ("reserved2", 16, 4, 0),
            ("lun", 20, 8, LUN_WIRE),
            ("reserved3", 28, 2, 0),
            ("tsk_mgmt_func", 30, 1, 0x40),
            ("reserved4", 31, 1, 0),
            ("task_tag", 32, 8, 0x3132_3334_3536_3738),
            ("reserved5", 40, 8, 0),
        ],
    );
}

#[test]
fn rsp_and_small_ius() {
    let rsp = Rsp {
        sol_not: 1,
        req_lim_delta: 0x0102_0304,
        tag: TAG,
        flags: RspFlags(RspFlags::DOOVER | RspFlags::DIUNDER),
        status: 0x28,
        data_out_res_cnt: 0x2122_2324,
        data_in_res_cnt: 0x3132_3334,
        response_data: Some(&[0xe0; 4]),
        sense_data: Some(&[0xf0; 18]),
    };
    let mut b = vec![0xffu8; rsp.buffer_len()];
    rsp.emit(&mut b).unwrap();
    check(
        "srp_rsp",
        &b,
        &[
            ("opcode", 0, 1, 0xc1),
            ("sol_not", 1, 1, 1),
            ("reserved1", 2, 2, 0),
            ("req_lim_delta", 4, 4, 0x0102_0304),
            ("tag", 8, 8, TAG_WIRE),
            ("reserved2", 16, 2, 0),
            ("flags", 18, 1, 0x27),
            ("status", 19, 1, 0x28),
            ("data_out_res_cnt", 20, 4, 0x2122_2324),
            ("data_in_res_cnt", 24, 4, 0x3132_3334),
            ("sense_data_len", 28, 4, 18),
            ("resp_data_len", 32, 4, 4),
            ("data[0] (response data first)", 36, 4, 0xe0e0_e0e0),
            ("data[4] (then sense)", 40, 1, 0xf0),
        ],
    );

    let small: [(Iu, &str, u8, u8, u64); 5] = [
        (
            Iu::ILogout(ILogout { tag: TAG }),
            "srp_i_logout",
            0x03,
            0,
            0,
        ),
        (
            Iu::TLogout(TLogout {
                sol_not: 1,
                reason: TLogoutReason::Unknown(0x0102_0304),
                tag: TAG,
            }),
            "srp_t_logout",
            0x80,
            1,
            0x0102_0304,
        ),
        (
            Iu::CredReq(CredReq {
                sol_not: 1,
                req_lim_delta: 0x0102_0304,
                tag: TAG,
            }),
            "srp_cred_req",
            0x81,
            1,
            0x0102_0304,
        ),
        (
            Iu::CredRsp(CredRsp { tag: TAG }),
            "srp_cred_rsp",
            0x41,
            0,
            0,
        ),
        (Iu::AerRsp(AerRsp { tag: TAG }), "srp_aer_rsp", 0x42, 0, 0),
    ];
    for (iu, name, op, sol, word) in small {
        let v = iu.to_vec().unwrap();
        assert_eq!(v.len(), 16, "{name}");
        check(
            name,
            &v,
            &[
                ("opcode", 0, 1, u64::from(op)),
                ("sol_not / reserved", 1, 1, u64::from(sol)),
                ("reserved", 2, 2, 0),
                ("reason / req_lim_delta / reserved", 4, 4, word),
                ("tag", 8, 8, TAG_WIRE),
            ],
        );
    }

    let aer = AerReq {
        sol_not: 1,
        req_lim_delta: 0x0102_0304,
        tag: TAG,
        lun: LUN,
        sense_data: &[0xf0; 8],
    };
    let v = Iu::AerReq(aer).to_vec().unwrap();
    check(
        "srp_aer_req",
        &v,
        &[
            ("opcode", 0, 1, 0x82),
            ("sol_not", 1, 1, 1),
            ("reserved", 2, 2, 0),
            ("req_lim_delta", 4, 4, 0x0102_0304),
            ("tag", 8, 8, TAG_WIRE),
            ("reserved2", 16, 4, 0),
            ("lun", 20, 8, LUN_WIRE),
            ("sense_data_len", 28, 4, 8),
            ("reserved3", 32, 4, 0),
            ("sense_data", 36, 8, 0xf0f0_f0f0_f0f0_f0f0),
        ],
    );
}
