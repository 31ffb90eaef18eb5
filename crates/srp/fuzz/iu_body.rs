// Body shared by the cargo-fuzz target `iu_parse` and the deterministic
// test `tests/fuzz_mutations.rs` (included with `include!`).
//
// Byte 0 picks the immediate data offset the parser is given (none, Linux's
// 68, or byte 1); the rest is the IU. Properties: no parser panics; whatever
// parses re-emits to `buffer_len()` bytes that parse to the same repr and
// emit the same bytes again (emit is a fixed point).

#[allow(dead_code)]
fn check_iu_bytes(data: &[u8]) -> Option<srp::wire::IuType> {
    use srp::wire::*;
    let (sel, iu) = match data {
        [sel, rest @ ..] => (*sel, rest),
        [] => return None,
    };
    let imm = match sel % 4 {
        0 => None,
        1 => Some(LINUX_IMM_DATA_OFFSET),
        2 => Some(u16::from(iu.first().copied().unwrap_or(0))),
        _ => Some(u16::from(sel)),
    };

    // The 56-byte RDMA CM login form has no opcode in byte 0.
    if let Ok(req) = LoginReq::parse_rdma(iu) {
        let mut a = [0u8; LOGIN_REQ_RDMA_LEN];
        req.emit_rdma(&mut a).expect("emit_rdma");
        assert_eq!(LoginReq::parse_rdma(&a), Ok(req));
        assert_eq!(&a[..12], &iu[..12], "tag, formats, flags, opcode kept");
    }
    // Views over any buffer: checked constructors never panic, getters then work.
    if let Ok(p) = CmdPacket::new_checked(iu) {
        let _ = (
            p.data_out_format(),
            p.data_in_format(),
            p.add_cdb_bytes(),
            p.cdb(),
        );
    }
    if let Ok(p) = RspPacket::new_checked(iu) {
        let _ = (p.flags(), p.sense_data_len(), p.resp_data_len());
    }
    if let Ok(p) = AerReqPacket::new_checked(iu) {
        let _ = p.sense_data_len();
    }
    if let Ok(p) = SmallPacket::new_checked(iu) {
        let _ = (p.word(), p.tag());
    }
    // Every typed parser, whatever the opcode byte says.
    let _ = LoginReq::parse(iu);
    let _ = LoginRsp::parse(iu);
    let _ = LoginRej::parse(iu);
    let _ = Cmd::parse(iu, imm);
    let _ = Rsp::parse(iu);
    let _ = TskMgmt::parse(iu);
    let _ = ILogout::parse(iu);
    let _ = TLogout::parse(iu);
    let _ = CredReq::parse(iu);
    let _ = CredRsp::parse(iu);
    let _ = AerReq::parse(iu);
    let _ = AerRsp::parse(iu);
    if let Ok(list) = DescList::new(iu) {
        assert_eq!(list.iter().count(), list.len());
    }

    let parsed = Iu::parse(iu, imm).ok()?;
    let mut out = vec![0u8; parsed.buffer_len()];
    let n = parsed.emit(&mut out).expect("a parsed IU must emit");
    assert_eq!(n, out.len());
    assert!(n <= iu.len(), "emit never grows a parsed IU");
    assert_eq!(out[0], iu[0], "opcode kept");
    let again = Iu::parse(&out, imm).expect("emitted IU must parse");
    assert_eq!(again, parsed, "parse(emit(x)) == x");
    assert_eq!(again.to_vec().expect("emit"), out, "emit is a fixed point");
    // Too short a buffer is an error, not a panic.
    if n > 0 {
        assert!(parsed.emit(&mut out[..n - 1]).is_err());
    }
    Some(parsed.iu_type())
}
