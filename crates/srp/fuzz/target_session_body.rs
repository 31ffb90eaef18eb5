// Body shared by the cargo-fuzz target `target_session` and the
// deterministic test `tests/target_fuzz.rs` (included with `include!`).
//
// The input is a script: a few bytes of settings, then operations on a
// target with two channels. Channel A gets everything the script says (raw
// IUs, well-formed commands, completions in order or failed, SCSI and TMF
// results, AERs, logouts, a disconnect); channel B, another initiator, runs
// one command alongside. Properties: nothing panics; A's credits always add
// up (window = initiator's + in flight + owed); never more than
// `srpt_sq_size` work requests outstanding; every SEND is a valid IU of at
// most `srp_max_rsp_size` bytes; every RDMA op is 1..=`srp_max_rdma_size`
// bytes and names a command not yet released; every command is released
// exactly once by the end; the SRQ is never over-promised; B finishes its
// command normally.

/// What one script reached, so the deterministic test can check that the
/// scripts get past login into data transfer, the SCSI core and teardown.
#[allow(dead_code)]
#[derive(Debug, Default, Clone, Copy)]
struct Reached {
    scsi: usize,
    rdma: usize,
    tables: usize,
    rsps: usize,
    tmfs: usize,
    logouts: usize,
}

#[allow(dead_code)]
fn run_target_session(data: &[u8]) -> Reached {
    use srp::target::*;
    use srp::wire::*;
    use std::collections::{BTreeSet, VecDeque};

    struct Cur<'a>(&'a [u8]);
    impl Cur<'_> {
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
        fn bytes(&mut self, n: usize) -> Vec<u8> {
            let n = n.min(self.0.len());
            let (a, b) = self.0.split_at(n);
            self.0 = b;
            a.to_vec()
        }
    }

    enum Pend {
        Send,
        Rdma(OpId),
        Table(OpId, u32),
    }

    #[derive(Default)]
    struct Seen {
        reached: Reached,
        pend: VecDeque<Pend>,
        scsi: Vec<CmdId>,
        tmfs: Vec<CmdId>,
        released: BTreeSet<CmdId>,
        named: BTreeSet<CmdId>,
        disconnected: bool,
    }

    fn drain(ch: &mut Channel, s: &mut Seen, sq: u32, max_rsp: u32, max_rdma: u32) {
        let mut guard = 0;
        while let Some(o) = ch.poll_output() {
            guard += 1;
            assert!(guard < 100_000, "poll_output must end");
            assert!(ch.outstanding_wrs() <= sq, "send queue overrun");
            match o {
                Output::Send { bytes, .. } => {
                    assert!(
                        bytes.len() <= max_rsp as usize,
                        "SEND of {} bytes",
                        bytes.len()
                    );
                    match Iu::parse(&bytes, None).expect("target emits valid IUs") {
                        Iu::Rsp(_) => s.reached.rsps += 1,
                        Iu::TLogout(_) => s.reached.logouts += 1,
                        _ => {}
                    }
                    s.pend.push_back(Pend::Send);
                }
                Output::RdmaRead(op) | Output::RdmaWrite(op) => {
                    assert!(op.len >= 1 && op.len <= max_rdma, "RDMA op of {}", op.len);
                    assert!(!s.released.contains(&op.cmd), "op names a released command");
                    s.named.insert(op.cmd);
                    s.reached.rdma += 1;
                    if matches!(op.local, Local::Table { .. }) {
                        s.reached.tables += 1;
                    }
                    s.pend.push_back(match op.local {
                        Local::Table { .. } => Pend::Table(op.id, op.len),
                        _ => Pend::Rdma(op.id),
                    });
                }
                Output::Scsi(r) => {
                    assert!(!s.released.contains(&r.cmd));
                    s.named.insert(r.cmd);
                    s.reached.scsi += 1;
                    s.scsi.push(r.cmd);
                }
                Output::Tmf(r) => {
                    s.named.insert(r.cmd);
                    s.reached.tmfs += 1;
                    s.tmfs.push(r.cmd);
                }
                Output::Abort(c) => assert!(s.named.contains(&c)),
                Output::Release(c) => {
                    assert!(s.released.insert(c), "released twice");
                }
                Output::Disconnect => s.disconnected = true,
            }
        }
    }

    // Built from wire bytes so the fuzz crate needs no rdma-types dependency.
    fn db(va: u64, key: u32, len: u32) -> DirectBuf {
        let mut b = [0u8; DIRECT_BUF_LEN];
        b[..8].copy_from_slice(&va.to_be_bytes());
        b[8..12].copy_from_slice(&key.to_be_bytes());
        b[12..].copy_from_slice(&len.to_be_bytes());
        DirectBuf::parse(&b).expect("16 bytes")
    }

    let mut cur = Cur(data);
    let mut cfg = TargetConfig::new(PortId([7; 16]), "fuzz");
    cfg.max_credits = 1 + u32::from(cur.u8() % 8);
    cfg.sq_size = 1 + u32::from(cur.u8() % 4);
    cfg.max_rdma_size = 64 * (1 + u32::from(cur.u8()));
    cfg.srq_size = 2 * (cfg.max_credits + RESERVED_RECV) + u32::from(cur.u8() % 4);
    cfg.max_data_len = 1 << 16;
    let (sq, max_rsp, max_rdma) = (cfg.sq_size, cfg.max_rsp_size, cfg.max_rdma_size);
    let srq = cfg.srq_size;
    let mut t = Target::new(cfg).expect("valid config");
    let login = |t: &mut Target, who: u8, imm: bool| {
        let req = LoginReq {
            tag: Tag(1),
            req_it_iu_len: 4148,
            req_buf_fmt: BufFormats::DIRECT | BufFormats::INDIRECT,
            flags: LoginReqFlags::new(MultiChannelAction::Single, imm),
            imm_data_offset: LINUX_IMM_DATA_OFFSET,
            initiator_port_id: PortId([who; 16]),
            target_port_id: PortId([7; 16]),
        };
        match t.login(&req) {
            Login::Accepted { channel, .. } => channel,
            Login::Rejected(r) => panic!("setup login rejected: {r}"),
        }
    };
    let imm = cur.u8() & 1 == 1;
    let a = login(&mut t, 1, imm);
    let b = login(&mut t, 2, false);
    let mut sa = Seen::default();
    let mut sb = Seen::default();

    // B: one command with 100 bytes of data-in.
    let b_cmd = Iu::Cmd(Cmd {
        sol_not: 0,
        tag: Tag(1),
        lun: Lun::default(),
        task_attr: TaskAttr::Simple,
        cdb: &[0x28; 16],
        data_out: DataDesc::None,
        data_in: DataDesc::Direct(db(0x1000, 1, 100)),
    })
    .to_vec()
    .expect("emit");
    if let Some(ch) = t.channel_mut(b) {
        ch.handle_recv(&b_cmd);
        drain(ch, &mut sb, sq, max_rsp, max_rdma);
    }

    let mut steps = 0;
    while !cur.0.is_empty() && steps < 256 {
        steps += 1;
        let op = cur.u8();
        let Some(ch) = t.channel_mut(a) else { break };
        match op % 12 {
            0 => {
                let n = usize::from(cur.u8()) * 2;
                let iu = cur.bytes(n);
                ch.handle_recv(&iu);
            }
            1 | 2 => {
                // A well-formed command with fuzz-chosen descriptors.
                let sel = cur.u8();
                let tag = u64::from(cur.u8() % 8);
                let len = cur.u32() % 70_000;
                let d0 = db(u64::from(cur.u32()), 2, len);
                let d1 = db(0x2000, 3, len / 3);
                let mut list = Vec::new();
                DescList::encode(&[d0, d1], &mut list);
                let table_entries = 2 + u32::from(sel >> 6);
                let ind = DataDesc::Indirect(IndirectBuf {
                    table: db(0x9000, 4, 16 * table_entries),
                    total_len: len + len / 3 + u32::from(sel & 0x20 != 0),
                    descs: DescList::new(&list[..16 * usize::from(1 + (sel & 1))]).expect("list"),
                });
                let imm_data = cur.bytes(usize::from(sel & 0x1f) * 8);
                let (out, inn) = match sel % 6 {
                    0 => (DataDesc::Direct(d0), DataDesc::None),
                    1 => (DataDesc::None, DataDesc::Direct(d0)),
                    2 => (ind, DataDesc::None),
                    3 => (DataDesc::Direct(d1), ind),
                    4 => (ind, ind),
                    _ => (
                        DataDesc::Immediate {
                            offset: LINUX_IMM_DATA_OFFSET,
                            data: &imm_data,
                        },
                        DataDesc::None,
                    ),
                };
                let c = Cmd {
                    sol_not: sel & 6,
                    tag: Tag(tag),
                    lun: Lun::default(),
                    task_attr: TaskAttr::Simple,
                    cdb: &[0x2a; 16],
                    data_out: out,
                    data_in: inn,
                };
                if let Ok(iu) = Iu::Cmd(c).to_vec() {
                    ch.handle_recv(&iu);
                }
            }
            3 => {
                let f = [
                    TmFunc::AbortTask,
                    TmFunc::AbortTaskSet,
                    TmFunc::LogicalUnitReset,
                    TmFunc::ClearAca,
                    TmFunc::Unknown(9),
                ];
                let tm = TskMgmt {
                    sol_not: 0,
                    tag: Tag(u64::from(cur.u8() % 8)),
                    lun: Lun::default(),
                    func: f[usize::from(cur.u8()) % f.len()],
                    task_tag: Tag(u64::from(cur.u8() % 8)),
                };
                ch.handle_recv(&Iu::TskMgmt(tm).to_vec().expect("emit"));
            }
            4..=6 => match sa.pend.pop_front() {
                Some(Pend::Send) => ch.handle_send_done(true),
                Some(Pend::Rdma(id)) => ch.handle_rdma_done(id, true),
                Some(Pend::Table(id, len)) => {
                    // Mostly the right length, sometimes garbage.
                    let mut tb = cur.bytes(len as usize);
                    if cur.u8() & 1 == 0 {
                        tb.resize(len as usize, 0);
                    }
                    ch.handle_table_read(id, Some(&tb));
                }
                None => {}
            },
            7 => match sa.pend.pop_front() {
                Some(Pend::Send) => ch.handle_send_done(false),
                Some(Pend::Rdma(id)) | Some(Pend::Table(id, _)) => ch.handle_rdma_done(id, false),
                None => {}
            },
            8 => {
                if !sa.scsi.is_empty() {
                    let i = usize::from(cur.u8()) % sa.scsi.len();
                    let c = sa.scsi.remove(i);
                    let status = cur.u8() & 2;
                    let sense_len = usize::from(cur.u8());
                    let done = ScsiDone {
                        cmd: c,
                        status,
                        sense: cur.bytes(sense_len),
                        data_in_len: cur.u32() % 100_000,
                        wanted_in: (cur.u8() & 1 == 1).then(|| cur.u32()),
                        wanted_out: None,
                        aborted: cur.u8() & 3 == 0,
                    };
                    ch.handle_scsi_done(done);
                }
            }
            9 => {
                if !sa.tmfs.is_empty() {
                    let c = sa.tmfs.remove(0);
                    ch.handle_tmf_done(c, RspCode::from(cur.u8() % 6));
                }
            }
            10 => {
                t.notify(AerEvent::LunsChanged);
            }
            _ => match cur.u8() % 4 {
                0 => ch.logout(TLogoutReason::NoReason),
                1 => ch.disconnected(),
                2 => {
                    // Logins with absurd private data never disturb A or B.
                    let bytes = cur.bytes(64);
                    let _ = t.login_private_data(&bytes, LoginForm::IbCm);
                }
                _ => {
                    let sense = cur.bytes(300);
                    ch.send_aer(Lun::default(), &sense);
                }
            },
        }
        if let Some(ch) = t.channel_mut(a) {
            drain(ch, &mut sa, sq, max_rsp, max_rdma);
            assert_eq!(
                ch.initiator_credits() + ch.in_flight() + ch.owed(),
                ch.window(),
                "credits add up"
            );
        }
        assert_eq!(
            t.credits_promised(),
            t.channel_ids()
                .iter()
                .filter_map(|&id| t.channel(id))
                .map(|c| u64::from(c.window() + RESERVED_RECV))
                .sum::<u64>(),
            "credits promised add up"
        );
        assert!(t.channel(a).is_none_or(|c| c.window() < srq), "window within the SRQ");
        assert_eq!(t.channel(b).map(|c| c.state()), Some(ChannelState::Live));
    }

    // Liveness: if A is still live, a well-behaved driver and core finish
    // everything, after which no request holds a credit.
    if let Some(ch) = t.channel_mut(a) {
        if ch.state() == ChannelState::Live {
            let mut rounds = 0;
            loop {
                rounds += 1;
                assert!(rounds < 500_000, "no progress");
                drain(ch, &mut sa, sq, max_rsp, max_rdma);
                if let Some(p) = sa.pend.pop_front() {
                    match p {
                        Pend::Send => ch.handle_send_done(true),
                        Pend::Rdma(id) => ch.handle_rdma_done(id, true),
                        Pend::Table(id, len) => {
                            ch.handle_table_read(id, Some(&vec![0; len as usize]))
                        }
                    }
                } else if let Some(c) = sa.scsi.pop() {
                    ch.handle_scsi_done(ScsiDone::good(c, 0));
                } else if let Some(c) = sa.tmfs.pop() {
                    ch.handle_tmf_done(c, RspCode::Complete);
                } else {
                    break;
                }
            }
            if ch.state() == ChannelState::Live {
                assert_eq!(ch.in_flight(), 0, "a request was never answered");
                assert_eq!(ch.outstanding_wrs(), 0);
            }
        }
    }

    // Tear A down: every command it ever named is released exactly once.
    if let Some(ch) = t.channel_mut(a) {
        ch.disconnected();
        drain(ch, &mut sa, sq, max_rsp, max_rdma);
        assert!(ch.poll_output().is_none());
    }
    for c in &sa.named {
        assert!(sa.released.contains(c), "command {c:?} never released");
    }
    assert!(t.remove(a));

    // B is untouched: its command completes with a response.
    let ch = t.channel_mut(b).expect("B");
    let c = sb.scsi[0];
    assert!(ch.handle_scsi_done(ScsiDone::good(c, 100)));
    loop {
        drain(ch, &mut sb, sq, max_rsp, max_rdma);
        match sb.pend.pop_front() {
            Some(Pend::Rdma(id)) => ch.handle_rdma_done(id, true),
            Some(Pend::Send) => ch.handle_send_done(true),
            Some(Pend::Table(..)) => unreachable!("B has no tables"),
            None => break,
        }
    }
    assert!(sb.released.contains(&c));
    assert_eq!(ch.in_flight(), 0);
    sa.reached
}
