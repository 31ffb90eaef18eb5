//! State-machine tests of the sans-IO SRP initiator channel: feed IUs and
//! time, expect IUs, completions and events.

use rdma_types::{Duration, Guid, Instant, Rkey};
use srp::initiator::*;
use srp::wire::*;

const T0: Instant = Instant::from_millis(1_000);

fn cfg() -> ChannelConfig {
    let mut c = ChannelConfig::new(
        0x0102_0304_0506_0708,
        Guid(0x0002_c903_0040_2bd5),
        0x00a0_b802_0040_2bd7,
        Guid(0x00a0_b802_0040_2bd8),
    );
    c.can_queue = 8;
    c
}

fn login_rsp(req_lim: u32, max_it: u32, imm: bool) -> Vec<u8> {
    Iu::LoginRsp(LoginRsp {
        req_lim_delta: req_lim,
        tag: Tag(0),
        max_it_iu_len: max_it,
        max_ti_iu_len: 4148,
        buf_fmt: BufFormats::DIRECT | BufFormats::INDIRECT,
        flags: LoginRspFlags::new(MultiChannelResult::NoExisting, imm),
    })
    .to_vec()
    .unwrap()
}

fn logged_in_with(c: ChannelConfig, req_lim: u32, imm: bool) -> Channel {
    let mut ch = Channel::new(c).unwrap();
    ch.login_request().unwrap();
    ch.handle_login_response(T0, &login_rsp(req_lim, 65536, imm))
        .unwrap();
    ch
}

fn logged_in(req_lim: u32) -> Channel {
    logged_in_with(cfg(), req_lim, true)
}

fn sends(ch: &mut Channel) -> Vec<Transmit> {
    let mut v = Vec::new();
    while let Some(o) = ch.poll_output() {
        match o {
            Output::Send(t) => v.push(t),
            Output::Reconnect => panic!("unexpected reconnect"),
        }
    }
    v
}

fn one_send(ch: &mut Channel) -> Transmit {
    let mut v = sends(ch);
    assert_eq!(v.len(), 1, "{v:?}");
    v.remove(0)
}

fn completions(ch: &mut Channel) -> Vec<Completion> {
    std::iter::from_fn(|| ch.poll_completion()).collect()
}

fn events(ch: &mut Channel) -> Vec<Event> {
    std::iter::from_fn(|| ch.poll_event()).collect()
}

fn seg(i: u64, len: u32) -> Segment {
    DirectBuf {
        va: 0x1000_0000 + i * 0x1000,
        key: Rkey(0x100 + i as u32),
        len,
    }
}

fn segs(n: usize) -> Vec<Segment> {
    (0..n as u64).map(|i| seg(i, 512)).collect()
}

const READ10: [u8; 10] = [0x28, 0, 0, 0, 0, 0x10, 0, 0, 1, 0];
const WRITE10: [u8; 10] = [0x2a, 0, 0, 0, 0, 0x10, 0, 0, 1, 0];

/// A READ of `n` segments (kept for the rest of the test).
fn read(lun: u64, n: usize) -> Command<'static> {
    Command::new(Lun::from_u64(lun), &READ10, Data::In(segs(n).leak()))
}

fn rsp(tag: Tag, delta: i32, status: u8) -> Vec<u8> {
    Iu::Rsp(Rsp {
        sol_not: 0,
        req_lim_delta: delta,
        tag,
        flags: RspFlags::default(),
        status,
        data_out_res_cnt: 0,
        data_in_res_cnt: 0,
        response_data: None,
        sense_data: None,
    })
    .to_vec()
    .unwrap()
}

fn tmf_rsp(tag: Tag, code: RspCode) -> Vec<u8> {
    let data = code.to_response_data();
    Iu::Rsp(Rsp {
        sol_not: 0,
        req_lim_delta: 1,
        tag,
        flags: RspFlags::default(),
        status: 0,
        data_out_res_cnt: 0,
        data_in_res_cnt: 0,
        response_data: Some(&data),
        sense_data: None,
    })
    .to_vec()
    .unwrap()
}

fn parse_cmd(t: &Transmit) -> Cmd<'_> {
    assert_eq!(t.iu, IuType::Cmd);
    match Iu::parse(&t.bytes, Some(LINUX_IMM_DATA_OFFSET)).unwrap() {
        Iu::Cmd(c) => c,
        other => panic!("not a command: {other:?}"),
    }
}

fn parse_tmf(t: &Transmit) -> TskMgmt {
    assert_eq!(t.iu, IuType::TskMgmt);
    TskMgmt::parse(&t.bytes).unwrap()
}

// ---------------------------------------------------------------- login

#[test]
fn login_request_as_ib_srp_builds_it() {
    let mut ch = Channel::new(cfg()).unwrap();
    let req = ch.login_request().unwrap();
    // initiator_ext then port GUID, id_ext then ioc_guid, big-endian.
    assert_eq!(
        req.initiator_port_id.0,
        [1, 2, 3, 4, 5, 6, 7, 8, 0x00, 0x02, 0xc9, 0x03, 0x00, 0x40, 0x2b, 0xd5]
    );
    assert_eq!(req.target_port_id.id_ext(), 0x00a0_b802_0040_2bd7);
    assert_eq!(req.target_port_id.guid(), 0x00a0_b802_0040_2bd8);
    assert_eq!(req.tag, Tag(0));
    assert_eq!(req.req_buf_fmt, BufFormats::DIRECT | BufFormats::INDIRECT);
    assert_eq!(req.flags.multichannel(), MultiChannelAction::Single);
    assert!(req.flags.immediate_requested());
    assert_eq!(req.imm_data_offset, 68);
    // max(48 + 16 + 20 + 12 * 16, 68 + 8192)
    assert_eq!(req.req_it_iu_len, 8260);
    // Both wire forms carry the same values.
    let mut ib = [0u8; LOGIN_REQ_LEN];
    req.emit(&mut ib).unwrap();
    assert_eq!(LoginReq::parse(&ib).unwrap(), req);
    let mut rdma = [0u8; LOGIN_REQ_RDMA_LEN];
    req.emit_rdma(&mut rdma).unwrap();
    assert_eq!(LoginReq::parse_rdma(&rdma).unwrap(), req);
    // A second login while one is outstanding is refused.
    assert!(matches!(ch.login_request(), Err(LoginError::Busy(_))));
}

#[test]
fn login_request_other_channels_multi_rev10_and_caps() {
    let mut c = cfg();
    c.channel_index = 3;
    c.want_immediate = false;
    c.io_class_rev10 = true;
    c.cmd_sg_entries = 4;
    let req = Channel::new(c.clone()).unwrap().login_request().unwrap();
    assert_eq!(req.flags.multichannel(), MultiChannelAction::Multi);
    assert!(!req.flags.immediate_requested());
    assert_eq!(req.imm_data_offset, 0);
    assert_eq!(req.req_it_iu_len, 48 + 16 + 20 + 4 * 16);
    // Revision 10 targets: GUID first.
    assert_eq!(req.initiator_port_id.id_ext(), 0x0002_c903_0040_2bd5);
    assert_eq!(req.initiator_port_id.guid(), 0x0102_0304_0506_0708);
    assert_eq!(req.target_port_id.id_ext(), 0x00a0_b802_0040_2bd8);
    c.max_it_iu_size = 100;
    assert_eq!(c.login_req().req_it_iu_len, 100);
    c.max_it_iu_size = 10;
    assert_eq!(Channel::new(c).unwrap_err(), ConfigError::MaxItIuSize(10));
    let mut c = cfg();
    c.cmd_sg_entries = 0;
    assert_eq!(Channel::new(c).unwrap_err(), ConfigError::CmdSgEntries);
}

#[test]
fn login_accept_negotiates() {
    let mut ch = Channel::new(cfg()).unwrap();
    assert_eq!(ch.submit(T0, &read(0, 1)), Err(SubmitError::NotLoggedIn));
    ch.login_request().unwrap();
    let neg = ch
        .handle_login_response(T0, &login_rsp(5, 4096, true))
        .unwrap();
    assert_eq!(neg.req_lim, 5);
    assert_eq!(neg.max_it_iu_len, 4096, "the target's smaller limit wins");
    assert_eq!(neg.max_ti_iu_len, 4148);
    assert_eq!(neg.imm_data_offset, Some(68));
    assert_eq!(neg.multichannel, MultiChannelResult::NoExisting);
    assert_eq!(
        neg.can_queue, 4,
        "credits minus the task management reserve"
    );
    assert_eq!(ch.immediate_capacity(), Some(4096 - 68));
    assert!(ch.is_logged_in());
    assert_eq!(ch.credits(), 5);
    // A second answer is not expected.
    assert_eq!(
        ch.handle_login_response(T0, &login_rsp(5, 4096, true)),
        Err(LoginFailure::NotWaiting)
    );
}

#[test]
fn login_accept_without_target_immediate() {
    let mut ch = Channel::new(cfg()).unwrap();
    ch.login_request().unwrap();
    let neg = ch
        .handle_login_response(T0, &login_rsp(64, 65536, false))
        .unwrap();
    assert_eq!(neg.imm_data_offset, None);
    assert_eq!(neg.max_it_iu_len, 48 + 16 + 20 + 12 * 16);
    assert_eq!(neg.can_queue, 8, "can_queue of the config caps it");
    assert_eq!(ch.immediate_capacity(), None);
    let cmd = Command::new(Lun::from_u64(0), &WRITE10, Data::Immediate(&[1; 16]));
    assert_eq!(
        ch.submit(T0, &cmd),
        Err(SubmitError::ImmediateNotNegotiated)
    );
}

#[test]
fn login_reject_every_reason_decodes() {
    let reasons = (0x0001_0000..=0x0001_0006u32).chain([0x0001_0042]);
    for code in reasons {
        let mut ch = Channel::new(cfg()).unwrap();
        let req = ch.login_request().unwrap();
        let rej = Iu::LoginRej(LoginRej {
            reason: LoginRejReason::from(code),
            tag: Tag(0),
            buf_fmt: BufFormats::DIRECT,
        })
        .to_vec()
        .unwrap();
        let err = ch.handle_login_response(T0, &rej).unwrap_err();
        let LoginFailure::Rejected { reason, .. } = err else {
            panic!("{err:?}")
        };
        assert_eq!(u32::from(reason), code);
        let text = err.to_string();
        assert!(text.starts_with("SRP login rejected: "), "{text}");
        match reason.text() {
            Some(words) => assert!(text.contains(words), "{text}"),
            None => assert!(text.contains("0x10042") || text.contains("65602"), "{text}"),
        }
        if reason == LoginRejReason::ReqItIuLengthTooLarge {
            assert!(
                text.ends_with(&format!("(requested {})", req.req_it_iu_len)),
                "{text}"
            );
        }
        // The channel may log in again.
        assert!(!ch.is_logged_in());
        assert!(ch.login_request().is_ok());
    }
}

#[test]
fn login_bad_answers() {
    let mut ch = Channel::new(cfg()).unwrap();
    ch.login_request().unwrap();
    let e = ch.handle_login_response(T0, &[0xc0, 0, 0]).unwrap_err();
    assert!(matches!(e, LoginFailure::Malformed(_)), "{e}");
    ch.login_request().unwrap();
    let t = Iu::TLogout(TLogout {
        sol_not: 0,
        reason: TLogoutReason::NoReason,
        tag: Tag(0),
    })
    .to_vec()
    .unwrap();
    assert_eq!(
        ch.handle_login_response(T0, &t),
        Err(LoginFailure::Unexpected(IuType::TLogout))
    );
    ch.login_request().unwrap();
    assert_eq!(
        ch.handle_login_response(T0, &login_rsp(4, 40, false)),
        Err(LoginFailure::ItIuTooSmall(40))
    );
    assert!(!ch.is_logged_in());
}

// ---------------------------------------------------------- descriptors

#[test]
fn one_segment_is_direct() {
    let mut ch = logged_in(16);
    let tag = ch.submit(T0, &read(5, 1)).unwrap();
    let t = one_send(&mut ch);
    assert_eq!(t.tag, tag);
    assert!(t.ext_table.is_none());
    let c = parse_cmd(&t);
    assert_eq!(c.tag, tag);
    assert_eq!(c.lun, Lun::from_u64(5));
    assert_eq!(&c.cdb[..10], &READ10);
    assert_eq!(c.data_out, DataDesc::None);
    assert_eq!(c.data_in, DataDesc::Direct(seg(0, 512)));
    assert_eq!(t.bytes.len(), 48 + 16);
    assert_eq!(t.bytes[5], 0x01, "data-in format in the low nibble");
    assert_eq!(ch.credits(), 15);
}

#[test]
fn up_to_cmd_sg_entries_is_indirect_in_the_iu() {
    let mut ch = logged_in(16);
    let mut cmd = Command::new(Lun::from_u64(1), &WRITE10, Data::Out(segs(12).leak()));
    cmd.desc_table = Some(DirectBuf {
        va: 0xdead_0000,
        key: Rkey(0x77),
        len: 4096,
    });
    ch.submit(T0, &cmd).unwrap();
    let t = one_send(&mut ch);
    assert!(t.ext_table.is_none());
    let c = parse_cmd(&t);
    let DataDesc::Indirect(ind) = c.data_out else {
        panic!("{:?}", c.data_out)
    };
    assert_eq!(c.data_in, DataDesc::None);
    assert_eq!(t.bytes[5], 0x20, "data-out format in the high nibble");
    assert_eq!(t.bytes[6], 12, "data-out descriptor count");
    assert_eq!(ind.table.len, 12 * 16);
    assert_eq!((ind.table.va, ind.table.key), (0xdead_0000, Rkey(0x77)));
    assert_eq!(ind.total_len, 12 * 512);
    assert!(!ind.is_external());
    assert_eq!(ind.descs.iter().collect::<Vec<_>>(), segs(12));
    assert_eq!(t.bytes.len(), 48 + 20 + 12 * 16);
}

#[test]
fn more_than_cmd_sg_entries_without_ext_sg_is_refused() {
    let mut ch = logged_in(16);
    assert_eq!(
        ch.submit(T0, &read(0, 13)),
        Err(SubmitError::TooManySegments {
            segments: 13,
            max: 12
        })
    );
    assert!(ch.poll_output().is_none());
    assert_eq!(ch.credits(), 16, "a refused command takes no credit");
    assert_eq!(ch.outstanding(), 0);
}

#[test]
fn more_than_cmd_sg_entries_with_ext_sg_uses_an_external_table() {
    let mut c = cfg();
    c.allow_ext_sg = true;
    let mut ch = logged_in_with(c, 16, true);
    let mut cmd = read(2, 20);
    assert_eq!(ch.submit(T0, &cmd), Err(SubmitError::NeedTable(320)));
    cmd.desc_table = Some(DirectBuf {
        va: 0xbeef_0000,
        key: Rkey(0x99),
        len: 319,
    });
    assert_eq!(ch.submit(T0, &cmd), Err(SubmitError::NeedTable(320)));
    cmd.desc_table = Some(DirectBuf {
        va: 0xbeef_0000,
        key: Rkey(0x99),
        len: 320,
    });
    ch.submit(T0, &cmd).unwrap();
    let t = one_send(&mut ch);
    let c = parse_cmd(&t);
    let DataDesc::Indirect(ind) = c.data_in else {
        panic!("{:?}", c.data_in)
    };
    assert_eq!(t.bytes[7], 12, "the IU carries cmd_sg_entries descriptors");
    assert_eq!(ind.table_entries(), 20);
    assert!(ind.is_external());
    assert_eq!((ind.table.va, ind.table.key), (0xbeef_0000, Rkey(0x99)));
    assert_eq!(ind.total_len, 20 * 512);
    assert_eq!(ind.descs.iter().collect::<Vec<_>>(), segs(12));
    let table = t.ext_table.as_deref().expect("external table bytes");
    let all = DescList::new(table).unwrap();
    assert_eq!(all.iter().collect::<Vec<_>>(), segs(20));
}

#[test]
fn bad_data_is_refused() {
    let mut ch = logged_in(16);
    let cmd = Command::new(Lun::default(), &READ10, Data::In(&[]));
    assert_eq!(ch.submit(T0, &cmd), Err(SubmitError::EmptyData));
    let big = vec![seg(0, u32::MAX), seg(1, 1)];
    let cmd = Command::new(Lun::default(), &READ10, Data::In(&big));
    assert_eq!(
        ch.submit(T0, &cmd),
        Err(SubmitError::DataTooLong(u64::from(u32::MAX) + 1))
    );
    let cmd = Command::new(Lun::default(), &[0u8; 300], Data::None);
    assert!(matches!(ch.submit(T0, &cmd), Err(SubmitError::Encode(_))));
    assert_eq!(ch.credits(), 16);
}

#[test]
fn immediate_data_when_it_fits() {
    let mut c = cfg();
    c.max_imm_data = 1000;
    let mut ch = logged_in_with(c, 16, true);
    let cap = ch.immediate_capacity().unwrap();
    assert_eq!(cap, 1000);
    let data: Vec<u8> = (0..cap).map(|i| i as u8).collect();
    let cmd = Command::new(Lun::from_u64(3), &WRITE10, Data::Immediate(&data));
    ch.submit(T0, &cmd).unwrap();
    let t = one_send(&mut ch);
    assert_eq!(t.bytes.len(), 68 + 1000);
    assert_eq!(t.bytes[5] >> 4, 3, "immediate data-out format");
    assert_eq!(&t.bytes[68..], &data[..]);
    let c = parse_cmd(&t);
    assert_eq!(
        c.data_out,
        DataDesc::Immediate {
            offset: 68,
            data: &data
        }
    );
    let mut more = data;
    more.push(0);
    let cmd = Command::new(Lun::from_u64(3), &WRITE10, Data::Immediate(&more));
    assert_eq!(
        ch.submit(T0, &cmd),
        Err(SubmitError::ImmediateTooLarge {
            len: 1001,
            max: 1000
        })
    );
    // A CDB longer than 32 bytes overlaps the immediate data offset.
    let cmd = Command::new(Lun::from_u64(3), &[0u8; 40], Data::Immediate(&[1]));
    assert!(matches!(ch.submit(T0, &cmd), Err(SubmitError::Encode(_))));
}

#[test]
fn immediate_data_left_to_the_driver_is_counted_not_copied() {
    let mut c = cfg();
    c.max_imm_data = 1000;
    let mut ch = logged_in_with(c, 16, true);
    let data: Vec<u8> = (0..1000).map(|i| i as u8).collect();
    let mut cmd = Command::new(Lun::from_u64(3), &WRITE10, Data::Immediate(&data));
    cmd.immediate_follows = true;
    ch.submit(T0, &cmd).unwrap();
    let t = one_send(&mut ch);
    // The head alone, ending where the data goes; the data counted.
    assert_eq!((t.bytes.len(), t.follows), (68, 1000));
    let mut whole = t.bytes.clone();
    whole.extend_from_slice(&data);
    let plain = {
        let cmd = Command::new(Lun::from_u64(3), &WRITE10, Data::Immediate(&data));
        ch.submit(T0, &cmd).unwrap();
        one_send(&mut ch)
    };
    assert_eq!(plain.follows, 0);
    // The same IU as a whole one but for its tag (bytes 8..16).
    assert_eq!(whole[..8], plain.bytes[..8]);
    assert_eq!(whole[16..], plain.bytes[16..]);
    // Too large counts the data it leaves out as well.
    let more = vec![0u8; 1001];
    let mut cmd = Command::new(Lun::from_u64(3), &WRITE10, Data::Immediate(&more));
    cmd.immediate_follows = true;
    assert_eq!(
        ch.submit(T0, &cmd),
        Err(SubmitError::ImmediateTooLarge {
            len: 1001,
            max: 1000
        })
    );
}

// -------------------------------------------------------------- credits

#[test]
fn credit_exhaustion_keeps_one_for_task_management() {
    let mut c = cfg();
    c.cmd_timeout = Duration::from_secs(1);
    let mut ch = logged_in_with(c, 16, false);
    // Eight commands answered without returning credit.
    for _ in 0..8 {
        let t = ch.submit(T0, &read(0, 1)).unwrap();
        ch.handle_recv(T0, &rsp(t, 0, 0));
    }
    for t in sends(&mut ch) {
        ch.handle_send_done(t.id);
    }
    let _ = completions(&mut ch);
    assert_eq!((ch.credits(), ch.outstanding()), (8, 0));
    let first = T0 + Duration::from_millis(1);
    let a = ch.submit(first, &read(0, 1)).unwrap();
    for _ in 0..6 {
        ch.submit(T0 + Duration::from_millis(2), &read(0, 1))
            .unwrap();
    }
    assert_eq!(ch.credits(), 1);
    assert_eq!(ch.submit(T0, &read(0, 1)), Err(SubmitError::NoCredit));
    assert_eq!(sends(&mut ch).len(), 7);
    // The reserve serves the abort after a timeout.
    let at = ch.poll_timeout().unwrap();
    assert_eq!(at, first + Duration::from_secs(1));
    ch.handle_timeout(at);
    let t = one_send(&mut ch);
    let tm = parse_tmf(&t);
    assert_eq!((tm.func, tm.task_tag), (TmFunc::AbortTask, a));
    assert_eq!(ch.credits(), 0);
    // A response returns credits and commands flow again.
    ch.handle_recv(at, &rsp(a, 3, 0));
    assert_eq!(ch.credits(), 3);
    assert_eq!(
        completions(&mut ch)
            .iter()
            .map(|c| c.tag)
            .collect::<Vec<_>>(),
        vec![a]
    );
    assert!(ch.submit(at, &read(0, 1)).is_ok());
}

#[test]
fn queue_full_before_credits() {
    let mut ch = logged_in(100);
    for _ in 0..8 {
        ch.submit(T0, &read(0, 1)).unwrap();
    }
    assert_eq!(ch.submit(T0, &read(0, 1)), Err(SubmitError::QueueFull(8)));
}

#[test]
fn cred_req_and_aer_req_are_answered() {
    let mut ch = logged_in(1);
    assert_eq!(
        ch.submit(T0, &read(0, 1)).unwrap_err(),
        SubmitError::NoCredit
    );
    let req = Iu::CredReq(CredReq {
        sol_not: 0,
        req_lim_delta: 5,
        tag: Tag(0x1234),
    })
    .to_vec()
    .unwrap();
    ch.handle_recv(T0, &req);
    assert_eq!(ch.credits(), 6, "answers take no credit");
    let t = one_send(&mut ch);
    assert_eq!(t.iu, IuType::CredRsp);
    assert_eq!(
        Iu::parse(&t.bytes, None).unwrap(),
        Iu::CredRsp(CredRsp { tag: Tag(0x1234) })
    );
    assert!(ch.handle_send_done(t.id));
    assert!(!ch.handle_send_done(t.id), "a send completes once");

    let sense = [0x70, 0, 6, 0, 0, 0, 0, 10, 0, 0, 0, 0, 0x2a, 0x09];
    let aer = Iu::AerReq(AerReq {
        sol_not: 0,
        req_lim_delta: 1,
        tag: Tag(0x99),
        lun: Lun::from_u64(4),
        sense_data: &sense,
    })
    .to_vec()
    .unwrap();
    ch.handle_recv(T0, &aer);
    assert_eq!(ch.credits(), 7);
    let t = one_send(&mut ch);
    assert_eq!(
        Iu::parse(&t.bytes, None).unwrap(),
        Iu::AerRsp(AerRsp { tag: Tag(0x99) })
    );
    assert_eq!(
        events(&mut ch),
        vec![Event::Aer {
            lun: Lun::from_u64(4),
            sense: sense.to_vec()
        }]
    );
    assert!(ch.submit(T0, &read(0, 1)).is_ok());
}

// ------------------------------------------------------------ responses

#[test]
fn response_before_send_completion() {
    let mut ch = logged_in(16);
    let tag = ch.submit(T0, &read(0, 1)).unwrap();
    let t = one_send(&mut ch);
    // The SRP_RSP overtakes the send completion (seed 2.3.4).
    ch.handle_recv(T0, &rsp(tag, 1, 0));
    let done = completions(&mut ch);
    assert_eq!(done.len(), 1, "the result is not held back");
    assert_eq!((done[0].tag, done[0].status), (tag, Status::Scsi(0)));
    assert_eq!(
        ch.outstanding(),
        1,
        "the context lives until the send completes"
    );
    // A duplicate answer is dropped, never a second completion.
    ch.handle_recv(T0, &rsp(tag, 0, 0));
    assert!(completions(&mut ch).is_empty());
    assert_eq!(
        events(&mut ch),
        vec![Event::Protocol(ProtocolError::UnknownTag(tag))]
    );
    // The tag is not reused while the send is pending.
    let mut tags = vec![tag];
    for _ in 0..7 {
        tags.push(ch.submit(T0, &read(0, 1)).unwrap());
    }
    assert_eq!(ch.submit(T0, &read(0, 1)), Err(SubmitError::QueueFull(8)));
    tags.sort();
    tags.dedup();
    assert_eq!(tags.len(), 8);
    assert!(ch.handle_send_done(t.id));
    assert_eq!(ch.outstanding(), 7);
    let again = ch.submit(T0, &read(0, 1)).unwrap();
    assert_ne!(again, tag, "a reused slot gets a new generation");
    assert!(completions(&mut ch).is_empty());
}

#[test]
fn send_completion_then_response() {
    let mut ch = logged_in(16);
    let tag = ch.submit(T0, &read(0, 1)).unwrap();
    let t = one_send(&mut ch);
    assert!(ch.handle_send_done(t.id));
    assert_eq!(ch.outstanding(), 1);
    assert!(completions(&mut ch).is_empty());
    ch.handle_recv(T0, &rsp(tag, 1, 0));
    assert_eq!(completions(&mut ch)[0].tag, tag);
    assert_eq!(ch.outstanding(), 0);
}

#[test]
fn device_error_passed_up_with_sense_unretried() {
    let mut ch = logged_in(16);
    let tag = ch.submit(T0, &read(7, 2)).unwrap();
    let _ = sends(&mut ch);
    let sense = [0x70, 0, 3, 0, 0, 0, 0, 10, 0, 0, 0, 0, 0x11, 0x00]; // MEDIUM ERROR, UNRECOVERED READ ERROR
    let bytes = Iu::Rsp(Rsp {
        sol_not: 0,
        req_lim_delta: 1,
        tag,
        flags: RspFlags(RspFlags::DIUNDER),
        status: 0x02,
        data_out_res_cnt: 0,
        data_in_res_cnt: 512,
        response_data: None,
        sense_data: Some(&sense),
    })
    .to_vec()
    .unwrap();
    ch.handle_recv(T0, &bytes);
    let c = completions(&mut ch);
    assert_eq!(c.len(), 1);
    assert_eq!(c[0].status, Status::Scsi(0x02));
    assert_eq!(c[0].sense, sense);
    assert_eq!(c[0].data_in_residual, Some(Residual::Under(512)));
    assert_eq!(c[0].data_out_residual, None);
    // Nothing was resent.
    assert!(ch.poll_output().is_none());
}

#[test]
fn ordering_requests_in_submit_order_completions_in_arrival_order() {
    let mut ch = logged_in(16);
    let tags: Vec<Tag> = (0..5)
        .map(|i| ch.submit(T0, &read(i, 1)).unwrap())
        .collect();
    let sent: Vec<Tag> = sends(&mut ch).iter().map(|t| t.tag).collect();
    assert_eq!(sent, tags);
    for &t in [tags[3], tags[0], tags[4], tags[1], tags[2]].iter() {
        ch.handle_recv(T0, &rsp(t, 1, 0));
    }
    let got: Vec<Tag> = completions(&mut ch).iter().map(|c| c.tag).collect();
    assert_eq!(got, vec![tags[3], tags[0], tags[4], tags[1], tags[2]]);
}

#[test]
fn unexpected_and_malformed_ius_are_reported_and_dropped() {
    let mut ch = logged_in(16);
    let cmd = Iu::Cmd(Cmd {
        sol_not: 0,
        tag: Tag(1),
        lun: Lun::default(),
        task_attr: TaskAttr::Simple,
        cdb: &READ10,
        data_out: DataDesc::None,
        data_in: DataDesc::None,
    })
    .to_vec()
    .unwrap();
    ch.handle_recv(T0, &cmd);
    ch.handle_recv(T0, &[0xc1, 0, 0]);
    ch.handle_recv(T0, &[0x55; 40]);
    let ev = events(&mut ch);
    assert_eq!(
        ev[0],
        Event::Protocol(ProtocolError::Unexpected(IuType::Cmd))
    );
    assert!(matches!(
        ev[1],
        Event::Protocol(ProtocolError::Malformed(Error::Truncated { .. }))
    ));
    assert_eq!(
        ev[2],
        Event::Protocol(ProtocolError::Malformed(Error::UnknownOpcode(0x55)))
    );
    assert!(ch.is_logged_in());
    assert_eq!(ch.credits(), 16);
}

// ------------------------------------------------------- error handling

fn timeout_cfg() -> ChannelConfig {
    let mut c = cfg();
    c.cmd_timeout = Duration::from_secs(30);
    c.tmf_timeout = Duration::from_secs(5);
    c
}

#[test]
fn timeout_escalates_abort_then_lun_reset_then_reconnect() {
    let mut ch = logged_in_with(timeout_cfg(), 16, false);
    let tag = ch.submit(T0, &read(9, 1)).unwrap();
    let other = ch.submit(T0 + Duration::from_secs(1), &read(9, 1)).unwrap();
    for t in sends(&mut ch) {
        ch.handle_send_done(t.id);
    }
    let deadline = T0 + Duration::from_secs(30);
    assert_eq!(ch.poll_timeout(), Some(deadline));
    ch.handle_timeout(deadline - Duration::from_micros(1));
    assert!(ch.poll_output().is_none(), "nothing before the deadline");
    ch.handle_timeout(deadline);
    let abort = one_send(&mut ch);
    let tm = parse_tmf(&abort);
    assert_eq!(tm.func, TmFunc::AbortTask);
    assert_eq!(tm.task_tag, tag);
    assert_eq!(tm.lun, Lun::from_u64(9));
    assert_eq!(ch.poll_timeout(), Some(deadline + Duration::from_secs(1)));
    // ABORT TASK fails: LOGICAL UNIT RESET.
    ch.handle_recv(deadline, &tmf_rsp(tm.tag, RspCode::Failed));
    let reset = one_send(&mut ch);
    let tm2 = parse_tmf(&reset);
    assert_eq!(tm2.func, TmFunc::LogicalUnitReset);
    assert_eq!(tm2.lun, Lun::from_u64(9));
    assert_ne!(tm2.tag, tm.tag);
    assert!(completions(&mut ch).is_empty());
    // The second command's timer does not start a second TMF meanwhile.
    let t1 = deadline + Duration::from_secs(1);
    ch.handle_timeout(t1);
    assert!(ch.poll_output().is_none());
    // The LUN reset gets no answer: host reset.
    let t2 = deadline + Duration::from_secs(5);
    assert_eq!(ch.poll_timeout(), Some(t2));
    ch.handle_timeout(t2);
    assert_eq!(ch.poll_output(), Some(Output::Reconnect));
    assert_eq!(ch.poll_timeout(), None);
    assert_eq!(ch.submit(t2, &read(0, 1)), Err(SubmitError::NotLoggedIn));
    let ev = events(&mut ch);
    assert!(ev.contains(&Event::TimedOut { tag }));
    assert!(ev.contains(&Event::TimedOut { tag: other }));
    assert!(ev.contains(&Event::TaskMgmtDone {
        func: TmFunc::AbortTask,
        lun: Lun::from_u64(9),
        result: Err(TmfFailure::Response(Some(RspCode::Failed)))
    }));
    assert!(ev.contains(&Event::TaskMgmtDone {
        func: TmFunc::LogicalUnitReset,
        lun: Lun::from_u64(9),
        result: Err(TmfFailure::Timeout)
    }));
    // The driver reconnects: the commands end with DID_RESET...
    ch.disconnected(false);
    let c = completions(&mut ch);
    assert_eq!(c.len(), 2);
    assert_eq!((c[0].tag, c[0].status), (tag, Status::Reset));
    assert_eq!((c[1].tag, c[1].status), (other, Status::Reset));
    // ...and the path that recovers works again.
    ch.login_request().unwrap();
    ch.handle_login_response(t2, &login_rsp(16, 65536, false))
        .unwrap();
    let fresh = ch.submit(t2, &read(9, 1)).unwrap();
    ch.handle_recv(t2, &rsp(fresh, 1, 0));
    assert_eq!(completions(&mut ch)[0].status, Status::Scsi(0));
}

#[test]
fn successful_abort_completes_once_and_late_response_is_dropped() {
    let mut ch = logged_in_with(timeout_cfg(), 16, false);
    let tag = ch.submit(T0, &read(1, 1)).unwrap();
    let t = one_send(&mut ch);
    ch.handle_send_done(t.id);
    let deadline = ch.poll_timeout().unwrap();
    ch.handle_timeout(deadline);
    let tm = parse_tmf(&one_send(&mut ch));
    ch.handle_recv(deadline, &tmf_rsp(tm.tag, RspCode::Complete));
    let c = completions(&mut ch);
    assert_eq!(
        c,
        vec![Completion {
            tag,
            status: Status::Aborted,
            sense: vec![],
            response_code: None,
            data_in_residual: None,
            data_out_residual: None
        }]
    );
    assert_eq!(ch.outstanding(), 0);
    let credits = ch.credits();
    // The target's answer to the aborted command comes late.
    ch.handle_recv(deadline, &rsp(tag, 2, 0));
    assert!(completions(&mut ch).is_empty());
    assert_eq!(ch.credits(), credits + 2, "its credits still count");
    // A late answer to the TMF is dropped too.
    ch.handle_recv(deadline, &tmf_rsp(tm.tag, RspCode::Complete));
    let ev = events(&mut ch);
    assert_eq!(
        ev[ev.len() - 2..],
        [
            Event::Protocol(ProtocolError::UnknownTag(tag)),
            Event::Protocol(ProtocolError::UnknownTag(tm.tag))
        ]
    );
    assert!(ch.poll_output().is_none());
}

#[test]
fn response_during_abort_completes_normally_without_escalation() {
    let mut ch = logged_in_with(timeout_cfg(), 16, false);
    let tag = ch.submit(T0, &read(1, 1)).unwrap();
    let _ = sends(&mut ch);
    let deadline = ch.poll_timeout().unwrap();
    ch.handle_timeout(deadline);
    let tm = parse_tmf(&one_send(&mut ch));
    ch.handle_recv(deadline, &rsp(tag, 1, 0));
    assert_eq!(completions(&mut ch)[0].status, Status::Scsi(0));
    // The abort then fails (no such task): nothing to escalate.
    ch.handle_recv(deadline, &tmf_rsp(tm.tag, RspCode::Failed));
    assert!(ch.poll_output().is_none());
    assert!(completions(&mut ch).is_empty());
    assert!(ch.is_logged_in());
}

#[test]
fn abort_on_request_goes_through_the_error_handler() {
    let mut ch = logged_in(16);
    let a = ch.submit(T0, &read(1, 1)).unwrap();
    let b = ch.submit(T0, &read(1, 1)).unwrap();
    let _ = sends(&mut ch);
    assert_eq!(ch.oldest_unanswered(), Some(a));
    assert!(ch.abort(T0, a));
    let tm = parse_tmf(&one_send(&mut ch));
    assert_eq!((tm.func, tm.task_tag), (TmFunc::AbortTask, a));
    // A second request for b waits behind the first abort.
    assert!(ch.abort(T0, b));
    assert!(ch.abort(T0, b), "asking twice queues it once");
    assert!(ch.poll_output().is_none());
    ch.handle_recv(T0, &tmf_rsp(tm.tag, RspCode::Complete));
    assert_eq!(
        completions(&mut ch)
            .iter()
            .map(|c| (c.tag, c.status))
            .collect::<Vec<_>>(),
        vec![(a, Status::Aborted)]
    );
    let tm_b = parse_tmf(&one_send(&mut ch));
    assert_eq!(tm_b.task_tag, b);
    assert!(ch.poll_output().is_none(), "b is aborted once");
    // b's response overtakes its abort: it completes normally and the
    // failed abort escalates nothing.
    ch.handle_recv(T0, &rsp(b, 1, 0));
    assert_eq!(completions(&mut ch)[0].status, Status::Scsi(0));
    ch.handle_recv(T0, &tmf_rsp(tm_b.tag, RspCode::Failed));
    assert!(ch.poll_output().is_none());
    assert!(ch.is_logged_in());
    // Nothing left to abort; an answered tag is not aborted.
    assert_eq!(ch.oldest_unanswered(), None);
    assert!(!ch.abort(T0, a));
    assert!(ch.poll_output().is_none());
}

#[test]
fn lun_reset_success_ends_that_lun_only() {
    let mut ch = logged_in_with(timeout_cfg(), 16, false);
    let a = ch.submit(T0, &read(1, 1)).unwrap();
    let later = T0 + Duration::from_secs(10);
    let b = ch.submit(later, &read(1, 1)).unwrap();
    let other_lun = ch.submit(later, &read(2, 1)).unwrap();
    let _ = sends(&mut ch);
    let deadline = ch.poll_timeout().unwrap();
    ch.handle_timeout(deadline);
    let abort = parse_tmf(&one_send(&mut ch));
    // No answer to the abort within the TMF timeout.
    let t = deadline + Duration::from_secs(5);
    ch.handle_timeout(t);
    let reset = parse_tmf(&one_send(&mut ch));
    assert_eq!(reset.func, TmFunc::LogicalUnitReset);
    // New commands wait while the LUN reset runs.
    assert_eq!(ch.submit(t, &read(1, 1)), Err(SubmitError::Recovering));
    ch.handle_recv(t, &tmf_rsp(reset.tag, RspCode::Complete));
    let c = completions(&mut ch);
    assert_eq!(
        c.iter().map(|c| (c.tag, c.status)).collect::<Vec<_>>(),
        vec![(a, Status::Reset), (b, Status::Reset)]
    );
    assert!(
        ch.is_logged_in(),
        "a LUN reset does not take the channel down"
    );
    ch.handle_recv(t, &rsp(other_lun, 1, 0));
    assert_eq!(completions(&mut ch)[0].tag, other_lun);
    // The late answer to the abort is dropped.
    ch.handle_recv(t, &tmf_rsp(abort.tag, RspCode::Complete));
    assert!(completions(&mut ch).is_empty());
    assert!(ch.submit(t, &read(1, 1)).is_ok(), "commands flow again");
}

#[test]
fn no_credit_for_task_management_escalates_at_once() {
    let mut ch = logged_in_with(timeout_cfg(), 2, false);
    let tag = ch.submit(T0, &read(1, 1)).unwrap();
    let _ = sends(&mut ch);
    // The target takes the reserve away.
    let req = Iu::CredReq(CredReq {
        sol_not: 0,
        req_lim_delta: -1,
        tag: Tag(5),
    })
    .to_vec()
    .unwrap();
    ch.handle_recv(T0, &req);
    assert_eq!(ch.credits(), 0);
    let _ = sends(&mut ch);
    ch.handle_timeout(ch.poll_timeout().unwrap());
    assert_eq!(ch.poll_output(), Some(Output::Reconnect));
    let ev = events(&mut ch);
    assert!(ev.contains(&Event::TaskMgmtDone {
        func: TmFunc::LogicalUnitReset,
        lun: Lun::from_u64(1),
        result: Err(TmfFailure::NoCredit)
    }));
    ch.disconnected(false);
    assert_eq!(
        completions(&mut ch)[0],
        Completion {
            tag,
            status: Status::Reset,
            sense: vec![],
            response_code: None,
            data_in_residual: None,
            data_out_residual: None
        }
    );
}

// ----------------------------------------------------- logout, disconnect

#[test]
fn target_logout_kills_the_channel() {
    let mut ch = logged_in(16);
    let tag = ch.submit(T0, &read(0, 1)).unwrap();
    let _ = sends(&mut ch);
    let t = Iu::TLogout(TLogout {
        sol_not: 0,
        reason: TLogoutReason::Inactive,
        tag: Tag(0),
    })
    .to_vec()
    .unwrap();
    ch.handle_recv(T0, &t);
    assert_eq!(
        events(&mut ch),
        vec![Event::TargetLogout(TLogoutReason::Inactive)]
    );
    assert!(!ch.is_logged_in());
    assert_eq!(ch.submit(T0, &read(0, 1)), Err(SubmitError::NotLoggedIn));
    assert_eq!(ch.poll_timeout(), None);
    ch.disconnected(false);
    let c = completions(&mut ch);
    assert_eq!((c[0].tag, c[0].status), (tag, Status::TransportFailed));
    assert_eq!(ch.outstanding(), 0);
}

#[test]
fn disconnect_with_hold_keeps_commands_until_relogin_or_fail() {
    let mut ch = logged_in(16);
    let a = ch.submit(T0, &read(0, 1)).unwrap();
    let b = ch.submit(T0, &read(0, 1)).unwrap();
    let sent = sends(&mut ch);
    ch.handle_recv(T0, &rsp(a, 1, 0));
    assert_eq!(completions(&mut ch).len(), 1);
    ch.disconnected(true);
    assert!(completions(&mut ch).is_empty(), "held");
    assert_eq!(ch.outstanding(), 1, "the answered command is freed");
    assert!(
        !ch.handle_send_done(sent[1].id),
        "sends of the old QP are gone"
    );
    // Relogin ends the held command with DID_RESET so it is retried.
    ch.login_request().unwrap();
    let c = completions(&mut ch);
    assert_eq!((c[0].tag, c[0].status), (b, Status::Reset));
    ch.handle_login_response(T0, &login_rsp(16, 65536, true))
        .unwrap();
    let c2 = ch.submit(T0, &read(0, 1)).unwrap();
    let _ = sends(&mut ch);
    // fast_io_fail: held commands fail.
    ch.disconnected(true);
    ch.fail_held();
    let c = completions(&mut ch);
    assert_eq!((c[0].tag, c[0].status), (c2, Status::TransportFailed));
    assert_eq!(ch.outstanding(), 0);
}

#[test]
fn completions_fit_can_queue_and_counts_balance() {
    // Many rounds of submit/answer/send-done in mixed orders keep the
    // books: no leaked slot, no lost credit.
    let mut ch = logged_in(9);
    for round in 0..50u64 {
        let tags: Vec<Tag> = (0..8)
            .map(|_| ch.submit(T0, &read(round, 1)).unwrap())
            .collect();
        let sent = sends(&mut ch);
        for (i, t) in tags.iter().enumerate() {
            if i % 2 == 0 {
                ch.handle_send_done(sent[i].id);
            }
            ch.handle_recv(T0, &rsp(*t, 1, 0));
        }
        for (i, s) in sent.iter().enumerate() {
            if i % 2 == 1 {
                ch.handle_send_done(s.id);
            }
        }
        assert_eq!(completions(&mut ch).len(), 8);
        assert_eq!(ch.outstanding(), 0);
        assert_eq!(ch.credits(), 9);
    }
}

/// Channels of one nexus share the target's task set, so their tags must
/// never collide (the target answers a reused tag with OVERLAPPED
/// COMMANDS): the channel index is part of every command tag, and a
/// channel does not take another channel's tag for its own.
#[test]
fn channels_of_one_nexus_use_disjoint_tags() {
    let mut c1 = cfg();
    c1.channel_index = 1;
    let mut ch0 = logged_in(32);
    let mut ch1 = logged_in_with(c1, 32, true);
    let mut tags = std::collections::HashSet::new();
    for _ in 0..8 {
        let t0 = ch0.submit(T0, &read(0, 1)).unwrap();
        let t1 = ch1.submit(T0, &read(0, 1)).unwrap();
        assert!(tags.insert(t0) && tags.insert(t1), "{t0:?} {t1:?}");
        assert_ne!(t0, t1);
    }
    sends(&mut ch0);
    sends(&mut ch1);
    // Channel 1's tag sent back on channel 0 is unknown there.
    let foreign = *tags
        .iter()
        .find(|t| (t.0 >> 16) & 0xffff == 1)
        .expect("a channel 1 tag");
    ch0.handle_recv(T0, &rsp(foreign, 1, 0));
    assert!(completions(&mut ch0).is_empty());
    assert_eq!(
        events(&mut ch0),
        vec![Event::Protocol(ProtocolError::UnknownTag(foreign))]
    );
}
