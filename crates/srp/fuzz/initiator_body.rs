// Body shared by the cargo-fuzz target `initiator_session` and the
// deterministic test `tests/initiator_fuzz.rs` (included with `include!`).
//
// The input drives one initiator channel: a configuration, then a script of
// operations (submit, crafted or random received IUs, send completions,
// time, disconnects, logins). Properties: nothing panics; every SEND
// parses as the IU it claims to be; a command completes at most once and
// only if it was submitted; a command takes a credit only when more than
// the task management reserve is left; no timer runs while not logged in;
// after a final disconnect every submitted command has completed.

/// What one run reached, so the deterministic test can check that its
/// inputs go past the login.
#[allow(dead_code)]
#[derive(Debug, Default, Clone, Copy)]
struct SessionStats {
    logins: u32,
    submitted: u32,
    answered: u32,
    aborted: u32,
    reset: u32,
    failed: u32,
    tmfs: u32,
    reconnects: u32,
    ext_tables: u32,
    immediates: u32,
}

#[allow(dead_code)]
fn run_initiator_session(data: &[u8]) -> SessionStats {
    use rdma_types::{Duration, Guid, Instant, Rkey};
    use srp::initiator::*;
    use srp::wire::*;
    use std::collections::BTreeSet;

    struct Bytes<'a>(&'a [u8]);
    impl Bytes<'_> {
        fn u8(&mut self) -> u8 {
            match self.0.split_first() {
                Some((b, rest)) => {
                    self.0 = rest;
                    *b
                }
                None => 0,
            }
        }
        fn u32(&mut self) -> u32 {
            u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
        }
        fn take(&mut self, n: usize) -> Vec<u8> {
            let n = n.min(self.0.len());
            let (a, b) = self.0.split_at(n);
            self.0 = b;
            a.to_vec()
        }
    }

    let mut b = Bytes(data);
    let flags = b.u8();
    let mut cfg = ChannelConfig::new(1, Guid(2), 3, Guid(4));
    cfg.cmd_sg_entries = 1 + b.u8() % 8;
    cfg.allow_ext_sg = flags & 1 != 0;
    cfg.want_immediate = flags & 2 != 0;
    cfg.max_imm_data = u32::from(b.u8()) * 8;
    cfg.can_queue = 1 + u16::from(b.u8() % 6);
    cfg.cmd_timeout = Duration::from_millis(100 + u64::from(b.u8()) * 10);
    cfg.tmf_timeout = Duration::from_millis(50 + u64::from(b.u8()));
    let can_queue = usize::from(cfg.can_queue);
    let mut st = SessionStats::default();
    let Ok(mut ch) = Channel::new(cfg) else {
        return st;
    };

    let mut now = Instant::from_millis(1);
    let mut open: BTreeSet<Tag> = BTreeSet::new();
    let mut pending: Vec<SendId> = Vec::new();
    let mut tmf_tags: Vec<Tag> = Vec::new();

    fn login_answer(b: &mut Bytes<'_>) -> Vec<u8> {
        let kind = b.u8();
        if kind % 4 == 3 {
            let n = usize::from(b.u8() % 64);
            return b.take(n);
        }
        if kind % 4 == 2 {
            return Iu::LoginRej(LoginRej {
                reason: LoginRejReason::from(0x0001_0000 + u32::from(b.u8() % 9)),
                tag: Tag(0),
                buf_fmt: BufFormats(u16::from(b.u8())),
            })
            .to_vec()
            .unwrap_or_default();
        }
        Iu::LoginRsp(LoginRsp {
            req_lim_delta: u32::from(b.u8() % 12),
            tag: Tag(0),
            max_it_iu_len: 40 + u32::from(b.u8()) * 16,
            max_ti_iu_len: 4096,
            buf_fmt: BufFormats(u16::from(b.u8() & 6)),
            flags: LoginRspFlags(b.u8()),
        })
        .to_vec()
        .unwrap_or_default()
    }

    if ch.login_request().is_ok() {
        let ans = login_answer(&mut b);
        st.logins += u32::from(ch.handle_login_response(now, &ans).is_ok());
    }

    for _ in 0..256 {
        if b.0.is_empty() {
            break;
        }
        match b.u8() % 10 {
            0 | 1 => {
                let kind = b.u8();
                let n = usize::from(b.u8() % 20);
                let len = u32::from(b.u8()) * 512;
                let segs: Vec<Segment> = (0..n as u64)
                    .map(|i| DirectBuf {
                        va: i << 12,
                        key: Rkey(i as u32),
                        len,
                    })
                    .collect();
                let imm = vec![0xa5; if kind % 4 == 3 { usize::from(b.u8()) * 16 } else { 0 }];
                let data = match kind % 4 {
                    0 => Data::None,
                    1 => Data::In(&segs),
                    2 => Data::Out(&segs),
                    _ => Data::Immediate(&imm),
                };
                let mut cmd = Command::new(Lun::from_u64(u64::from(kind >> 6)), &[0x28; 10], data);
                cmd.immediate_follows = kind & 0x08 != 0;
                if kind & 0x10 != 0 {
                    cmd.desc_table = Some(DirectBuf {
                        va: 0x9000,
                        key: Rkey(9),
                        len: u32::from(b.u8()) * 16,
                    });
                }
                let long_cdb;
                if kind & 0x20 != 0 {
                    long_cdb = vec![0; usize::from(b.u8())];
                    cmd.cdb = &long_cdb;
                }
                let before = ch.credits();
                if let Ok(tag) = ch.submit(now, &cmd) {
                    assert!(before > TSK_MGMT_RESERVE, "the reserve is kept");
                    assert_eq!(ch.credits(), before - 1);
                    assert!(open.insert(tag), "tags are unique while outstanding");
                    st.submitted += 1;
                }
            }
            2 => {
                let pick = usize::from(b.u8());
                let tag = match open.iter().nth(pick % open.len().max(1)) {
                    Some(t) if pick & 0x80 == 0 => *t,
                    _ => Tag(u64::from(b.u32())),
                };
                let sense_len = usize::from(b.u8() % 24);
                let sense = b.take(sense_len);
                let rsp = Rsp {
                    sol_not: 0,
                    req_lim_delta: i32::from(b.u8() as i8 % 4),
                    tag,
                    flags: RspFlags(b.u8()),
                    status: b.u8(),
                    data_out_res_cnt: b.u32(),
                    data_in_res_cnt: b.u32(),
                    response_data: None,
                    sense_data: (!sense.is_empty()).then_some(&sense[..]),
                };
                ch.handle_recv(now, &Iu::Rsp(rsp).to_vec().unwrap_or_default());
            }
            3 => {
                let n = usize::from(b.u8());
                let raw = b.take(n);
                ch.handle_recv(now, &raw);
            }
            4 => {
                let which = b.u8();
                let delta = i32::from(b.u8() as i8 % 3);
                let tag = Tag(u64::from(b.u32()));
                let code = RspCode::from(b.u8() % 6).to_response_data();
                let iu = match which % 4 {
                    0 => Iu::CredReq(CredReq {
                        sol_not: 0,
                        req_lim_delta: delta,
                        tag,
                    })
                    .to_vec(),
                    1 => Iu::AerReq(AerReq {
                        sol_not: 0,
                        req_lim_delta: delta,
                        tag,
                        lun: Lun::default(),
                        sense_data: &[0x70, 0, 6],
                    })
                    .to_vec(),
                    2 => Iu::TLogout(TLogout {
                        sol_not: 0,
                        reason: TLogoutReason::from(u32::from(which >> 4)),
                        tag,
                    })
                    .to_vec(),
                    _ => Iu::Rsp(Rsp {
                        sol_not: 0,
                        req_lim_delta: delta,
                        tag: tmf_tags.last().copied().unwrap_or(tag),
                        flags: RspFlags::default(),
                        status: 0,
                        data_out_res_cnt: 0,
                        data_in_res_cnt: 0,
                        response_data: Some(&code),
                        sense_data: None,
                    })
                    .to_vec(),
                };
                ch.handle_recv(now, &iu.unwrap_or_default());
            }
            5 => {
                if !pending.is_empty() {
                    let i = usize::from(b.u8()) % pending.len();
                    let id = pending.swap_remove(i);
                    ch.handle_send_done(id);
                }
            }
            6 => {
                now += Duration::from_millis(u64::from(b.u8()) * 5);
                if ch.poll_timeout().is_some_and(|t| t <= now) {
                    ch.handle_timeout(now);
                }
            }
            7 => {
                let how = b.u8();
                ch.disconnected(how & 1 != 0);
                pending.clear();
                if how & 2 != 0 {
                    ch.fail_held();
                }
            }
            8 => {
                if ch.login_request().is_ok() {
                    let ans = login_answer(&mut b);
                    st.logins += u32::from(ch.handle_login_response(now, &ans).is_ok());
                }
            }
            _ => ch.handle_timeout(now),
        }

        let imm = ch.negotiated().and_then(|n| n.imm_data_offset);
        while let Some(o) = ch.poll_output() {
            if o == Output::Reconnect {
                st.reconnects += 1;
            }
            if let Output::Send(mut t) = o {
                // Immediate data left to the driver: what a driver writes
                // after the head (the harness's data is all 0xa5).
                if t.follows > 0 {
                    assert_eq!(t.iu, IuType::Cmd, "only an SRP_CMD leaves data to the driver");
                    assert_eq!(Some(t.bytes.len()), imm.map(usize::from), "the head ends at the data");
                    let whole = t.bytes.len() + t.follows;
                    t.bytes.resize(whole, 0xa5);
                }
                if let Iu::Cmd(c) = &iu_of(&t.bytes, imm) {
                    st.immediates += u32::from(matches!(c.data_out, DataDesc::Immediate { .. }));
                }
                let iu = iu_of(&t.bytes, imm);
                assert_eq!(iu.iu_type(), t.iu);
                assert_eq!(iu.tag(), t.tag);
                if let Some(max) = ch.negotiated().map(|n| n.max_it_iu_len) {
                    assert!(t.bytes.len() <= max as usize, "IU within max_it_iu_len");
                }
                if let Some(table) = &t.ext_table {
                    let list = DescList::new(table).expect("whole descriptors");
                    assert!(list.len() > usize::from(ch.config().cmd_sg_entries));
                    st.ext_tables += 1;
                }
                if t.iu == IuType::TskMgmt {
                    st.tmfs += 1;
                    tmf_tags.push(t.tag);
                }
                pending.push(t.id);
            }
        }
        while let Some(c) = ch.poll_completion() {
            assert!(open.remove(&c.tag), "completed once, and only if submitted");
            match c.status {
                Status::Scsi(_) => st.answered += 1,
                Status::Aborted => st.aborted += 1,
                Status::Reset => st.reset += 1,
                Status::TransportFailed => st.failed += 1,
            }
        }
        while ch.poll_event().is_some() {}
        assert!(ch.outstanding() <= can_queue);
        if !ch.is_logged_in() {
            assert_eq!(ch.poll_timeout(), None, "no timers while not logged in");
        }
    }

    ch.disconnected(false);
    ch.fail_held();
    while let Some(c) = ch.poll_completion() {
        assert!(open.remove(&c.tag), "completed once, and only if submitted");
    }
    assert!(
        open.is_empty(),
        "every command ends after a disconnect: {open:?}"
    );
    assert_eq!(ch.outstanding(), 0);
    st
}

#[allow(dead_code)]
fn iu_of(bytes: &[u8], imm: Option<u16>) -> srp::wire::Iu<'_> {
    srp::wire::Iu::parse(bytes, imm).expect("every SEND parses")
}
