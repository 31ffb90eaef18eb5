//! Sans-IO SRP target sessions: login validation, multi-channel actions,
//! credits, data movement, task management, AER and logout, driven by a
//! small in-test driver that plays the RDMA provider and the SCSI core.

use rdma_types::Rkey;
use srp::target::*;
use srp::wire::*;
use std::collections::{BTreeMap, VecDeque};

fn port(guid: u64) -> PortId {
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&0x0002_c903_000f_1366u64.to_be_bytes());
    b[8..].copy_from_slice(&guid.to_be_bytes());
    PortId(b)
}

fn tport() -> PortId {
    port(0x0002_c903_000f_1366)
}

fn cfg() -> TargetConfig {
    TargetConfig::new(tport(), "tgt")
}

fn req(initiator: u64, action: MultiChannelAction, imm: bool) -> LoginReq {
    LoginReq {
        tag: Tag(0x77),
        req_it_iu_len: 4148,
        req_buf_fmt: BufFormats::DIRECT | BufFormats::INDIRECT,
        flags: LoginReqFlags::new(action, imm),
        imm_data_offset: LINUX_IMM_DATA_OFFSET,
        initiator_port_id: port(initiator),
        target_port_id: tport(),
    }
}

fn accept(t: &mut Target, r: &LoginReq) -> (ChannelId, LoginRsp) {
    match t.login(r) {
        Login::Accepted { channel, rsp, .. } => (channel, rsp),
        Login::Rejected(rej) => panic!("rejected: {rej}"),
    }
}

fn rejected(t: &mut Target, r: &LoginReq) -> LoginRejReason {
    match t.login(r) {
        Login::Rejected(rej) => {
            assert_eq!(rej.tag, r.tag, "reject echoes the tag");
            rej.reason
        }
        Login::Accepted { .. } => panic!("accepted"),
    }
}

fn d(va: u64, key: u32, len: u32) -> DirectBuf {
    DirectBuf {
        va,
        key: Rkey(key),
        len,
    }
}

fn cmd(tag: u64, out: DataDesc<'_>, inn: DataDesc<'_>) -> Vec<u8> {
    Iu::Cmd(Cmd {
        sol_not: 0,
        tag: Tag(tag),
        lun: Lun::from_u64(0),
        task_attr: TaskAttr::Simple,
        cdb: &[0x28, 0, 0, 0, 0, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0],
        data_out: out,
        data_in: inn,
    })
    .to_vec()
    .unwrap()
}

fn no_data(tag: u64) -> Vec<u8> {
    cmd(tag, DataDesc::None, DataDesc::None)
}

fn tmf(tag: u64, func: TmFunc, task_tag: u64) -> Vec<u8> {
    Iu::TskMgmt(TskMgmt {
        sol_not: 0,
        tag: Tag(tag),
        lun: Lun::from_u64(0),
        func,
        task_tag: Tag(task_tag),
    })
    .to_vec()
    .unwrap()
}

/// Plays the RDMA provider (initiator memory by R_Key, per-command local
/// buffers) and records what is meant for the SCSI core.
#[derive(Default)]
struct Driver {
    /// Initiator memory regions by R_Key; a region starts at va 0x1000_0000 * key.
    remote: BTreeMap<u32, Vec<u8>>,
    out_buf: BTreeMap<CmdId, Vec<u8>>,
    in_buf: BTreeMap<CmdId, Vec<u8>>,
    sends: Vec<Vec<u8>>,
    solicited: Vec<bool>,
    scsi: Vec<ScsiRequest>,
    tmfs: Vec<TmfRequest>,
    aborts: Vec<CmdId>,
    released: Vec<CmdId>,
    disconnects: usize,
    /// Completions not yet reported (deferred mode).
    pending: VecDeque<Pending>,
    defer: bool,
    rdma_log: Vec<(bool, RdmaOp)>,
    max_outstanding: u32,
}

enum Pending {
    Send,
    Rdma(OpId),
    Table(OpId, Vec<u8>),
}

fn base(key: u32) -> u64 {
    0x1000_0000 * u64::from(key)
}

impl Driver {
    /// What is posted and not yet completed, in order: "send" or "rdma".
    fn posted_kinds(&self) -> Vec<&'static str> {
        self.pending
            .iter()
            .map(|p| match p {
                Pending::Send => "send",
                _ => "rdma",
            })
            .collect()
    }

    fn run(&mut self, ch: &mut Channel) {
        loop {
            while let Some(o) = ch.poll_output() {
                self.max_outstanding = self.max_outstanding.max(ch.outstanding_wrs());
                self.take(o);
            }
            if self.defer {
                return;
            }
            match self.pending.pop_front() {
                Some(p) => complete(ch, p),
                None => return,
            }
        }
    }

    /// Report the oldest deferred completion, then run.
    fn complete_one(&mut self, ch: &mut Channel) -> bool {
        let Some(p) = self.pending.pop_front() else {
            return false;
        };
        complete(ch, p);
        let defer = self.defer;
        self.run(ch);
        self.defer = defer;
        true
    }

    fn take(&mut self, o: Output) {
        match o {
            Output::Send { bytes, solicited } => {
                self.sends.push(bytes.to_vec());
                self.solicited.push(solicited);
                self.pending.push_back(Pending::Send);
            }
            Output::RdmaRead(op) => {
                self.rdma_log.push((true, op));
                let mem = &self.remote[&op.rkey.0];
                let at = (op.remote_va - base(op.rkey.0)) as usize;
                let bytes = mem[at..at + op.len as usize].to_vec();
                match op.local {
                    Local::DataOut { offset } => {
                        let b = self.out_buf.entry(op.cmd).or_default();
                        let end = offset as usize + bytes.len();
                        if b.len() < end {
                            b.resize(end, 0);
                        }
                        b[offset as usize..end].copy_from_slice(&bytes);
                        self.pending.push_back(Pending::Rdma(op.id));
                    }
                    Local::Table { .. } => self.pending.push_back(Pending::Table(op.id, bytes)),
                    Local::DataIn { .. } => panic!("READ into data-in"),
                }
            }
            Output::RdmaWrite(op) => {
                self.rdma_log.push((false, op));
                let Local::DataIn { offset } = op.local else {
                    panic!("WRITE from {:?}", op.local)
                };
                let src = &self.in_buf[&op.cmd][offset as usize..][..op.len as usize];
                let at = (op.remote_va - base(op.rkey.0)) as usize;
                self.remote.get_mut(&op.rkey.0).unwrap()[at..at + src.len()].copy_from_slice(src);
                self.pending.push_back(Pending::Rdma(op.id));
            }
            Output::Scsi(r) => self.scsi.push(r),
            Output::Tmf(r) => self.tmfs.push(r),
            Output::Abort(c) => self.aborts.push(c),
            Output::Release(c) => self.released.push(c),
            Output::Disconnect => self.disconnects += 1,
        }
    }

    fn last_iu(&self) -> Iu<'_> {
        Iu::parse(self.sends.last().expect("a send"), None).expect("valid IU")
    }

    fn ius(&self) -> Vec<Iu<'_>> {
        self.sends
            .iter()
            .map(|b| Iu::parse(b, None).unwrap())
            .collect()
    }
}

fn complete(ch: &mut Channel, p: Pending) {
    match p {
        Pending::Send => ch.handle_send_done(true),
        Pending::Rdma(id) => ch.handle_rdma_done(id, true),
        Pending::Table(id, b) => ch.handle_table_read(id, Some(&b)),
    }
}

fn rsp<'a>(iu: &Iu<'a>) -> Rsp<'a> {
    match iu {
        Iu::Rsp(r) => *r,
        other => panic!("expected SRP_RSP, got {}", other.iu_type()),
    }
}

fn t_logout(iu: &Iu<'_>) -> TLogoutReason {
    match iu {
        Iu::TLogout(l) => l.reason,
        other => panic!("expected SRP_T_LOGOUT, got {}", other.iu_type()),
    }
}

fn setup(c: TargetConfig) -> (Target, ChannelId) {
    let mut t = Target::new(c).unwrap();
    let (id, _) = accept(&mut t, &req(1, MultiChannelAction::Single, true));
    (t, id)
}

// ---- login -----------------------------------------------------------------

#[test]
fn login_accepts_with_linux_compatible_fields() {
    let mut t = Target::new(cfg()).unwrap();
    let (id, rsp) = accept(&mut t, &req(1, MultiChannelAction::Single, true));
    assert_eq!(rsp.tag, Tag(0x77));
    assert_eq!(rsp.req_lim_delta, 128);
    assert_eq!(rsp.max_it_iu_len, 4148);
    assert_eq!(rsp.max_ti_iu_len, 256);
    assert_eq!(rsp.buf_fmt, BufFormats::DIRECT | BufFormats::INDIRECT);
    assert_eq!(rsp.flags.multichannel(), MultiChannelResult::NoExisting);
    assert!(rsp.flags.immediate_supported());
    let ch = t.channel(id).unwrap();
    assert_eq!(ch.imm_data_offset(), Some(LINUX_IMM_DATA_OFFSET));
    assert_eq!(ch.initiator_credits(), 128);
    assert_eq!(t.credits_promised(), u64::from(128 + RESERVED_RECV));

    // The RDMA CM form of the same login, and immediate data not asked for.
    let mut b = [0u8; LOGIN_REQ_RDMA_LEN];
    req(2, MultiChannelAction::Single, false)
        .emit_rdma(&mut b)
        .unwrap();
    match t.login_private_data(&b, LoginForm::RdmaCm) {
        Login::Accepted { rsp, channel, .. } => {
            assert!(!rsp.flags.immediate_supported());
            assert_eq!(t.channel(channel).unwrap().imm_data_offset(), None);
        }
        other => panic!("{other:?}"),
    }
    // An immediate data offset inside SRP_CMD is not honoured.
    let mut r = req(3, MultiChannelAction::Single, true);
    r.imm_data_offset = 40;
    let (_, rsp) = accept(&mut t, &r);
    assert!(!rsp.flags.immediate_supported());
}

#[test]
fn login_rejects_every_reason() {
    use LoginRejReason as R;
    let mut t = Target::new(cfg()).unwrap();

    // IT IU length outside 64..=srp_max_req_size (Linux ib_srpt's range).
    for len in [0, 63, cfg().max_req_size + 1, u32::MAX] {
        let mut r = req(1, MultiChannelAction::Single, false);
        r.req_it_iu_len = len;
        assert_eq!(rejected(&mut t, &r), R::ReqItIuLengthTooLarge, "len {len}");
    }
    // Wrong target port.
    let mut r = req(1, MultiChannelAction::Single, false);
    r.target_port_id = port(0xdead);
    assert_eq!(rejected(&mut t, &r), R::UnableAssociateChannel);
    // A buffer format we do not know.
    let mut r = req(1, MultiChannelAction::Single, false);
    r.req_buf_fmt = BufFormats(0x0008) | BufFormats::DIRECT;
    assert_eq!(rejected(&mut t, &r), R::UnsupportedDescriptorFmt);
    // Reserved multi-channel action.
    let mut r = req(1, MultiChannelAction::Single, false);
    r.flags = LoginReqFlags(2);
    assert_eq!(rejected(&mut t, &r), R::UnableEstablishChannel);
    // Private data that is no login at all.
    match t.login_private_data(&[0u8; 10], LoginForm::IbCm) {
        Login::Rejected(rej) => assert_eq!(rej.reason, R::UnableEstablishChannel),
        other => panic!("{other:?}"),
    }
    assert!(t.channel_ids().is_empty(), "no channel from any reject");

    // Initiator not on the access list.
    let mut c = cfg();
    c.allowed_initiators = Some(vec![port(9)]);
    let mut t = Target::new(c).unwrap();
    assert_eq!(
        rejected(&mut t, &req(1, MultiChannelAction::Single, false)),
        R::UnableEstablishChannel
    );
    accept(&mut t, &req(9, MultiChannelAction::Single, false));

    // Direct-only target, initiator requires indirect.
    let mut c = cfg();
    c.buf_formats = BufFormats::DIRECT;
    let mut t = Target::new(c).unwrap();
    let rej = match t.login(&req(1, MultiChannelAction::Single, false)) {
        Login::Rejected(rej) => rej,
        other => panic!("{other:?}"),
    };
    assert_eq!(rej.reason, R::UnsupportedDescriptorFmt);
    assert_eq!(
        rej.buf_fmt,
        BufFormats::DIRECT,
        "reject names what is supported"
    );
    assert!(
        rej.to_string().contains("descriptor formats not supported"),
        "{rej}"
    );

    // Multi-channel disabled: a MULTI login joining a live nexus.
    let mut c = cfg();
    c.multichannel = false;
    let mut t = Target::new(c).unwrap();
    accept(&mut t, &req(1, MultiChannelAction::Multi, false));
    assert_eq!(
        rejected(&mut t, &req(1, MultiChannelAction::Multi, false)),
        R::MultiChannelUnsupported
    );

    // Channel limit per nexus.
    let mut c = cfg();
    c.max_channels_per_nexus = 2;
    let mut t = Target::new(c).unwrap();
    accept(&mut t, &req(1, MultiChannelAction::Multi, false));
    accept(&mut t, &req(1, MultiChannelAction::Multi, false));
    assert_eq!(
        rejected(&mut t, &req(1, MultiChannelAction::Multi, false)),
        R::ChannelLimitReached
    );
    accept(&mut t, &req(2, MultiChannelAction::Multi, false));

    // Port disabled, then the port's channel limit: the refusal names the
    // setting that raises it; a SINGLE login replacing its nexus's channel
    // still fits.
    let mut c = cfg();
    c.enabled = false;
    let mut t = Target::new(c).unwrap();
    assert_eq!(
        rejected(&mut t, &req(1, MultiChannelAction::Single, false)),
        R::InsufficientResources
    );
    let mut c = cfg();
    c.max_channels = 2;
    let mut t = Target::new(c).unwrap();
    accept(&mut t, &req(1, MultiChannelAction::Single, false));
    accept(&mut t, &req(2, MultiChannelAction::Single, false));
    assert_eq!(
        rejected(&mut t, &req(3, MultiChannelAction::Single, false)),
        R::InsufficientResources
    );
    let why = t.last_refusal().unwrap_or_default().to_string();
    assert!(why.contains("max_channels = 2"), "{why}");
    accept(&mut t, &req(2, MultiChannelAction::Single, false));
    assert_eq!(t.last_refusal(), None);
}

/// Credits are a flow-control promise, not a reservation (SCST, Linux
/// ib_srpt): with the defaults, 256 initiators each get the full window
/// although together they were promised more than the SRQ holds.
#[test]
fn the_srq_does_not_limit_logins_and_every_window_is_whole() {
    let mut t = Target::new(cfg()).unwrap();
    for who in 1..=256u64 {
        let (id, rsp) = accept(&mut t, &req(who, MultiChannelAction::Single, false));
        assert_eq!(rsp.req_lim_delta, 128, "initiator {who}");
        assert_eq!(t.channel(id).unwrap().initiator_credits(), 128);
    }
    let srq = u64::from(t.config().srq_size);
    assert_eq!(t.credits_promised(), 256 * u64::from(128 + RESERVED_RECV));
    assert!(t.credits_promised() > srq);
    // A small SRQ caps each window, never the number of logins.
    let mut c = cfg();
    c.srq_size = 100 + RESERVED_RECV;
    let mut t = Target::new(c).unwrap();
    for who in 1..=8u64 {
        let (_, rsp) = accept(&mut t, &req(who, MultiChannelAction::Single, false));
        assert_eq!(rsp.req_lim_delta, 100);
    }
}

#[test]
fn bad_config_is_refused() {
    let mut c = cfg();
    c.max_req_size = 10;
    let e = Target::new(c).unwrap_err();
    assert_eq!(e.key, "srp_max_req_size");
    assert!(e.to_string().contains("srp_max_req_size = 10"));
    let mut c = cfg();
    c.srq_size = RESERVED_RECV;
    assert_eq!(Target::new(c).unwrap_err().key, "srpt_srq_size");
}

// ---- multi-channel ---------------------------------------------------------

#[test]
fn single_terminates_the_nexus_and_multi_maintains_it() {
    let mut t = Target::new(cfg()).unwrap();
    // MULTI with nothing to keep: NO EXISTING (r16a 6.3).
    let (a, rsp) = accept(&mut t, &req(1, MultiChannelAction::Multi, false));
    assert_eq!(rsp.flags.multichannel(), MultiChannelResult::NoExisting);
    let (b, rsp) = accept(&mut t, &req(1, MultiChannelAction::Multi, false));
    assert_eq!(rsp.flags.multichannel(), MultiChannelResult::Maintained);
    let (other, _) = accept(&mut t, &req(2, MultiChannelAction::Single, false));
    assert_eq!(t.nexus_channels(port(1)), vec![a, b]);

    // A command in flight on `a` is aborted in the SCSI core by the SINGLE login.
    let mut da = Driver::default();
    let cha = t.channel_mut(a).unwrap();
    cha.handle_recv(&no_data(5));
    da.run(cha);
    assert_eq!(da.scsi.len(), 1);

    let c = match t.login(&req(1, MultiChannelAction::Single, false)) {
        Login::Accepted {
            channel,
            rsp,
            terminated,
        } => {
            assert_eq!(rsp.flags.multichannel(), MultiChannelResult::Terminated);
            assert_eq!(terminated, vec![a, b]);
            channel
        }
        other => panic!("{other:?}"),
    };
    assert_eq!(t.nexus_channels(port(1)), vec![c]);
    for (id, mut drv) in [(a, da), (b, Driver::default())] {
        let ch = t.channel_mut(id).unwrap();
        drv.defer = true;
        drv.run(ch);
        assert_eq!(t_logout(&drv.last_iu()), TLogoutReason::MultiChannelAction);
        assert_eq!(drv.disconnects, 0, "Disconnect waits for the T_LOGOUT send");
        drv.defer = false;
        drv.run(ch);
        assert_eq!(drv.disconnects, 1);
        assert_eq!(ch.state(), ChannelState::Closed);
        if id == a {
            assert_eq!(drv.aborts, vec![drv.scsi[0].cmd]);
            assert!(!ch.handle_scsi_done(ScsiDone::good(drv.scsi[0].cmd, 0)));
        }
        assert!(t.remove(id));
    }
    assert_eq!(t.channel(other).unwrap().state(), ChannelState::Live);
    assert_eq!(t.channel(c).unwrap().state(), ChannelState::Live);
    assert_eq!(t.credits_promised(), 2 * u64::from(128 + RESERVED_RECV));
}

// ---- credits ---------------------------------------------------------------

fn small_window(n: u32) -> TargetConfig {
    let mut c = cfg();
    c.max_credits = n;
    c
}

#[test]
fn credits_are_returned_on_every_response_and_over_limit_is_refused() {
    let (mut t, id) = setup(small_window(4));
    let ch = t.channel_mut(id).unwrap();
    let mut drv = Driver::default();
    for tag in 1..=4 {
        ch.handle_recv(&no_data(tag));
    }
    drv.run(ch);
    assert_eq!(drv.scsi.len(), 4);
    assert_eq!(ch.initiator_credits(), 0);

    // A fifth command: TASK SET FULL, no credit, not given to the core.
    ch.handle_recv(&no_data(5));
    drv.run(ch);
    assert_eq!(drv.scsi.len(), 4);
    let r = rsp(&drv.last_iu());
    assert_eq!((r.tag, r.status, r.req_lim_delta), (Tag(5), 0x28, 0));
    assert_eq!(ch.stats().over_limit, 1);

    // One completion at a time: each response returns one credit.
    let cmds: Vec<CmdId> = drv.scsi.iter().map(|r| r.cmd).collect();
    for &c in &cmds[..2] {
        assert!(ch.handle_scsi_done(ScsiDone::good(c, 0)));
        drv.run(ch);
    }
    // Two before the driver polls: the first response carries both (the
    // delta is taken when the IU is built), the second none.
    for &c in &cmds[2..] {
        assert!(ch.handle_scsi_done(ScsiDone::good(c, 0)));
    }
    drv.run(ch);
    let deltas: Vec<i32> = drv.ius()[1..]
        .iter()
        .map(|i| rsp(i).req_lim_delta)
        .collect();
    assert_eq!(deltas, vec![1, 1, 2, 0]);
    assert_eq!(ch.initiator_credits(), 4);
    assert_eq!(
        ch.in_flight() + ch.owed() + ch.initiator_credits(),
        ch.window()
    );
}

#[test]
fn an_initiator_that_keeps_ignoring_the_limit_is_logged_out() {
    let (mut t, id) = setup(small_window(1));
    let ch = t.channel_mut(id).unwrap();
    let mut drv = Driver::default();
    ch.handle_recv(&no_data(1));
    for tag in 2..=(2 + RESERVED_RECV as u64) {
        ch.handle_recv(&no_data(tag));
    }
    drv.run(ch);
    assert_eq!(ch.stats().logout_reason, Some(TLogoutReason::NoReason));
    assert_eq!(t_logout(&drv.last_iu()), TLogoutReason::NoReason);
    assert_eq!(drv.disconnects, 1);
    assert_eq!(
        drv.aborts.len(),
        1,
        "the admitted command is aborted in the core"
    );
}

#[test]
fn cred_req_when_credits_are_freed_without_a_response() {
    let (mut t, id) = setup(small_window(4));
    let ch = t.channel_mut(id).unwrap();
    let mut drv = Driver::default();
    ch.handle_recv(&no_data(1));
    ch.handle_recv(&no_data(2));
    drv.run(ch);
    let (c1, c2) = (drv.scsi[0].cmd, drv.scsi[1].cmd);
    // One aborted: 1 owed, 1 in flight, 1*2 < 4: its response will carry it.
    let aborted = |cmd| ScsiDone {
        aborted: true,
        ..ScsiDone::good(cmd, 0)
    };
    assert!(ch.handle_scsi_done(aborted(c1)));
    drv.run(ch);
    assert!(drv.sends.is_empty());
    assert_eq!(ch.owed(), 1);
    // The second too: nothing in flight would carry the credits -> CRED_REQ.
    assert!(ch.handle_scsi_done(aborted(c2)));
    drv.run(ch);
    let tag = match drv.last_iu() {
        Iu::CredReq(c) => {
            assert_eq!(c.req_lim_delta, 2);
            c.tag
        }
        other => panic!("{other:?}"),
    };
    assert_eq!(ch.initiator_credits(), 4);
    assert_eq!(drv.released, vec![c1, c2]);
    ch.handle_recv(&Iu::CredRsp(CredRsp { tag }).to_vec().unwrap());
    assert_eq!(ch.state(), ChannelState::Live);
    // A second CRED_RSP answers nothing.
    ch.handle_recv(&Iu::CredRsp(CredRsp { tag }).to_vec().unwrap());
    drv.run(ch);
    assert_eq!(t_logout(&drv.last_iu()), TLogoutReason::SpuriousResponse);
}

// ---- data movement ---------------------------------------------------------

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn data_out_by_rdma_read_split_at_max_rdma_size_across_indirect_descriptors() {
    let mut c = cfg();
    c.max_rdma_size = 4096;
    let (mut t, id) = setup(c);
    let ch = t.channel_mut(id).unwrap();
    let mut drv = Driver::default();
    let mem = pattern(20000, 7);
    drv.remote.insert(3, mem.clone());
    let descs = [
        d(base(3), 3, 5000),
        d(base(3) + 6000, 3, 100),
        d(base(3) + 8000, 3, 9000),
    ];
    let mut list = Vec::new();
    DescList::encode(&descs, &mut list);
    let out = DataDesc::Indirect(IndirectBuf {
        table: d(0xabc0, 9, 48),
        total_len: 14100,
        descs: DescList::new(&list).unwrap(),
    });
    ch.handle_recv(&cmd(1, out, DataDesc::None));
    drv.run(ch);
    let reads: Vec<(u64, u32, u64)> = drv
        .rdma_log
        .iter()
        .map(|(r, o)| {
            assert!(r);
            let Local::DataOut { offset } = o.local else {
                panic!()
            };
            (o.remote_va - base(3), o.len, offset)
        })
        .collect();
    assert_eq!(
        reads,
        vec![
            (0, 4096, 0),
            (4096, 904, 4096),
            (6000, 100, 5000),
            (8000, 4096, 5100),
            (12096, 4096, 9196),
            (16192, 808, 13292),
        ]
    );
    let r = &drv.scsi[0];
    assert_eq!(r.data_out, DataOut::InBuffer { len: 14100 });
    let want: Vec<u8> = [&mem[..5000], &mem[6000..6100], &mem[8000..17000]].concat();
    assert_eq!(
        drv.out_buf[&r.cmd], want,
        "every byte where the descriptors say"
    );
    assert!(ch.handle_scsi_done(ScsiDone::good(r.cmd, 0)));
    drv.run(ch);
    assert_eq!(rsp(&drv.last_iu()).status, 0);
}

#[test]
fn data_in_by_rdma_write_then_the_response_behind_them_and_the_buffer_held_until_they_complete() {
    let mut c = cfg();
    c.max_rdma_size = 1000;
    let (mut t, id) = setup(c);
    let ch = t.channel_mut(id).unwrap();
    let mut drv = Driver {
        defer: true,
        ..Driver::default()
    };
    drv.remote.insert(5, vec![0; 4000]);
    ch.handle_recv(&cmd(
        9,
        DataDesc::None,
        DataDesc::Direct(d(base(5) + 100, 5, 2500)),
    ));
    drv.run(ch);
    let r = drv.scsi[0].clone();
    assert_eq!((r.data_in_len, r.tag), (2500, Tag(9)));
    let data = pattern(2500, 3);
    drv.in_buf.insert(r.cmd, data.clone());
    assert!(ch.handle_scsi_done(ScsiDone::good(r.cmd, 2500)));
    drv.run(ch);
    let lens: Vec<u32> = drv.rdma_log.iter().map(|(_, o)| o.len).collect();
    assert_eq!(lens, vec![1000, 1000, 500]);
    // The response is posted at once, behind the WRITEs on the same QP (RC
    // executes them in order: the initiator has the data before the
    // response), as Linux ib_srpt chains them.
    let order = drv.posted_kinds();
    assert_eq!(order, ["rdma", "rdma", "rdma", "send"]);
    let rsp0 = rsp(&drv.last_iu());
    assert_eq!((rsp0.status, rsp0.flags.0, rsp0.req_lim_delta), (0, 0, 1));
    // The buffer stays until every WRITE completed: a retransmitted WRITE
    // still reads it.
    for _ in 0..2 {
        assert!(drv.complete_one(ch));
        assert!(drv.released.is_empty(), "buffer released under a WRITE");
    }
    assert!(drv.complete_one(ch));
    assert_eq!(drv.released, vec![r.cmd]);
    assert_eq!(&drv.remote[&5][100..2600], &data[..]);
    assert!(drv.complete_one(ch), "the response's send completion");
    assert_eq!(drv.sends.len(), 1);
}

#[test]
fn residuals_and_sense_are_reported_and_cut_to_the_response_size() {
    let (mut t, id) = setup(cfg());
    let ch = t.channel_mut(id).unwrap();
    let mut drv = Driver::default();
    drv.remote.insert(1, vec![0; 1 << 16]);
    ch.handle_recv(&cmd(
        1,
        DataDesc::None,
        DataDesc::Direct(d(base(1), 1, 4096)),
    ));
    ch.handle_recv(&cmd(
        2,
        DataDesc::None,
        DataDesc::Direct(d(base(1), 1, 512)),
    ));
    drv.run(ch);
    let (c1, c2) = (drv.scsi[0].cmd, drv.scsi[1].cmd);
    drv.in_buf.insert(c1, vec![1; 4096]);
    drv.in_buf.insert(c2, vec![2; 512]);
    // Short read with a long (descriptor-format-sized) sense.
    let done = ScsiDone {
        status: 0x02,
        sense: vec![0x72; 300],
        ..ScsiDone::good(c1, 1024)
    };
    assert!(ch.handle_scsi_done(done));
    // The CDB asked for more than the initiator described.
    let done = ScsiDone {
        wanted_in: Some(2048),
        ..ScsiDone::good(c2, 512)
    };
    assert!(ch.handle_scsi_done(done));
    drv.run(ch);
    let ius = drv.ius();
    let r1 = rsp(&ius[0]);
    assert_eq!(r1.status, 2);
    assert!(r1.flags.has(RspFlags::DIUNDER) && r1.sense_data.is_some());
    assert_eq!(r1.data_in_res_cnt, 4096 - 1024);
    assert_eq!(r1.sense_data.unwrap().len(), 256 - 36);
    assert_eq!(drv.sends[0].len(), 256);
    let r2 = rsp(&ius[1]);
    assert!(r2.flags.has(RspFlags::DIOVER));
    assert_eq!(r2.data_in_res_cnt, 1536);
    let writes: u32 = drv.rdma_log.iter().map(|(_, o)| o.len).sum();
    assert_eq!(writes, 1024 + 512);
}

#[test]
fn external_indirect_table_is_fetched_by_rdma_read() {
    let (mut t, id) = setup(cfg());
    let ch = t.channel_mut(id).unwrap();
    let mut drv = Driver::default();
    let mem = pattern(3000, 1);
    drv.remote.insert(2, mem.clone());
    let descs = [
        d(base(2), 2, 1000),
        d(base(2) + 1500, 2, 500),
        d(base(2) + 2500, 2, 100),
    ];
    let mut table = Vec::new();
    DescList::encode(&descs, &mut table);
    // The table lives in initiator memory (key 8); the IU holds its first entry.
    drv.remote.insert(8, table.clone());
    let out = DataDesc::Indirect(IndirectBuf {
        table: d(base(8), 8, 48),
        total_len: 1600,
        descs: DescList::new(&table[..16]).unwrap(),
    });
    ch.handle_recv(&cmd(4, out, DataDesc::None));
    drv.run(ch);
    let (read, first) = drv.rdma_log[0];
    assert!(read);
    assert_eq!(
        (first.local, first.len),
        (Local::Table { data_in: false }, 48)
    );
    let want: Vec<u8> = [&mem[..1000], &mem[1500..2000], &mem[2500..2600]].concat();
    assert_eq!(drv.out_buf[&drv.scsi[0].cmd], want);

    // A table whose lengths do not add up to TOTAL LENGTH: CHECK CONDITION.
    let mut bad = table.clone();
    bad[47] = 99;
    drv.remote.insert(8, bad);
    let out = DataDesc::Indirect(IndirectBuf {
        table: d(base(8), 8, 48),
        total_len: 1600,
        descs: DescList::new(&table[..16]).unwrap(),
    });
    ch.handle_recv(&cmd(5, out, DataDesc::None));
    drv.run(ch);
    assert_eq!(drv.scsi.len(), 1);
    let r = rsp(&drv.last_iu());
    assert_eq!((r.tag, r.status), (Tag(5), 2));
    assert_eq!(&r.sense_data.unwrap()[12..14], &[0x0e, 0x03]);
    assert_eq!(ch.in_flight(), 1);
}

#[test]
fn a_bad_first_table_is_answered_after_the_second_table_read_lands() {
    let (mut t, id) = setup(cfg());
    let ch = t.channel_mut(id).unwrap();
    let mut drv = Driver {
        defer: true,
        ..Driver::default()
    };
    let mut table = Vec::new();
    DescList::encode(&[d(base(2), 2, 10), d(base(2) + 10, 2, 10)], &mut table);
    drv.remote.insert(2, vec![0; 100]);
    drv.remote.insert(8, table.clone());
    let ind = DataDesc::Indirect(IndirectBuf {
        table: d(base(8), 8, 32),
        total_len: 20,
        descs: DescList::new(&table[..16]).unwrap(),
    });
    ch.handle_recv(&cmd(6, ind, ind));
    drv.run(ch);
    assert_eq!(drv.rdma_log.len(), 2, "both tables requested");
    // The data-out table comes back short; the data-in READ is still posted.
    drv.pending.pop_front();
    let (_, first) = drv.rdma_log[0];
    ch.handle_table_read(first.id, Some(&table[..16]));
    drv.run(ch);
    assert!(drv.sends.is_empty() && drv.released.is_empty());
    assert!(drv.complete_one(ch));
    let r = rsp(&drv.last_iu());
    assert_eq!((r.tag, r.status), (Tag(6), 2));
    assert_eq!(drv.released.len(), 1);
    assert!(drv.scsi.is_empty());
    assert_eq!(ch.in_flight(), 0);
}

#[test]
fn immediate_data_when_negotiated_and_a_logout_when_not() {
    let (mut t, id) = setup(cfg());
    let ch = t.channel_mut(id).unwrap();
    let mut drv = Driver::default();
    let data = pattern(512, 9);
    let iu = cmd(
        1,
        DataDesc::Immediate {
            offset: LINUX_IMM_DATA_OFFSET,
            data: &data,
        },
        DataDesc::None,
    );
    ch.handle_recv(&iu);
    drv.run(ch);
    assert_eq!(drv.scsi[0].data_out, DataOut::Immediate(data));
    assert!(drv.rdma_log.is_empty());

    let (id2, _) = accept(&mut t, &req(2, MultiChannelAction::Single, false));
    let ch2 = t.channel_mut(id2).unwrap();
    let mut drv2 = Driver::default();
    ch2.handle_recv(&iu);
    drv2.run(ch2);
    assert_eq!(
        t_logout(&drv2.last_iu()),
        TLogoutReason::UnsupportedDataOutFormat
    );
    assert_eq!(t.channel(id).unwrap().state(), ChannelState::Live);
}

#[test]
fn the_send_queue_never_holds_more_than_srpt_sq_size() {
    let mut c = cfg();
    c.sq_size = 3;
    c.max_rdma_size = 100;
    let (mut t, id) = setup(c);
    let ch = t.channel_mut(id).unwrap();
    let mut drv = Driver {
        defer: true,
        ..Driver::default()
    };
    drv.remote.insert(1, pattern(1000, 0));
    ch.handle_recv(&cmd(
        1,
        DataDesc::Direct(d(base(1), 1, 1000)),
        DataDesc::None,
    ));
    drv.run(ch);
    assert_eq!(drv.rdma_log.len(), 3, "3 of 10 READs posted");
    while drv.complete_one(ch) {}
    assert_eq!(drv.rdma_log.len(), 10);
    assert_eq!(drv.max_outstanding, 3);
    assert_eq!(drv.out_buf[&drv.scsi[0].cmd], pattern(1000, 0));
}

// ---- task management -------------------------------------------------------

#[test]
fn abort_task_on_a_command_with_the_core() {
    let (mut t, id) = setup(cfg());
    let ch = t.channel_mut(id).unwrap();
    let mut drv = Driver::default();
    ch.handle_recv(&no_data(0x10));
    ch.handle_recv(&tmf(0x11, TmFunc::AbortTask, 0x10));
    drv.run(ch);
    let victim = drv.scsi[0].cmd;
    let tm = drv.tmfs[0];
    assert_eq!(
        (tm.func, tm.task_tag, tm.task),
        (TmFunc::AbortTask, Tag(0x10), Some(victim))
    );
    // SAM: the aborted task ends (no response), then the TMF completes.
    assert!(ch.handle_scsi_done(ScsiDone {
        aborted: true,
        ..ScsiDone::good(victim, 0)
    }));
    assert!(ch.handle_tmf_done(tm.cmd, RspCode::Complete));
    drv.run(ch);
    assert_eq!(drv.sends.len(), 1, "only the TMF response");
    let r = rsp(&drv.last_iu());
    assert_eq!(r.tag, Tag(0x11));
    assert_eq!(r.response_code(), Some(RspCode::Complete));
    assert_eq!(
        r.req_lim_delta, 2,
        "the aborted command's credit rides along"
    );
    assert_eq!(ch.initiator_credits(), ch.window());
    assert!(
        !ch.handle_scsi_done(ScsiDone::good(victim, 0)),
        "late completion ignored"
    );
}

/// A 200 000-byte WRITE (tag 1) whose data-out the channel is fetching:
/// its four READs handed to a driver that holds their completions.
fn fetching_200k(ch: &mut Channel) -> (Driver, CmdId) {
    let mut drv = Driver {
        defer: true,
        ..Driver::default()
    };
    drv.remote.insert(1, vec![0; 300_000]);
    ch.handle_recv(&cmd(
        1,
        DataDesc::Direct(d(base(1), 1, 200_000)),
        DataDesc::None,
    ));
    drv.run(ch);
    assert_eq!(drv.rdma_log.len(), 4, "four READs posted");
    let id = drv.rdma_log[0].1.cmd;
    (drv, id)
}

#[test]
fn abort_task_set_stops_a_command_still_fetching_data_out() {
    let (mut t, id) = setup(cfg());
    let ch = t.channel_mut(id).unwrap();
    let (mut drv, cmd_id) = fetching_200k(ch);
    ch.handle_recv(&tmf(2, TmFunc::AbortTaskSet, 0));
    drv.run(ch);
    assert_eq!(drv.tmfs[0].task, None);
    assert!(
        drv.released.is_empty(),
        "READs still posted into its buffer"
    );
    while drv.complete_one(ch) {}
    assert_eq!(drv.released, vec![cmd_id]);
    assert!(drv.scsi.is_empty(), "never reached the core");
    assert!(ch.handle_tmf_done(drv.tmfs[0].cmd, RspCode::Complete));
    drv.defer = false;
    drv.run(ch);
    assert_eq!(rsp(&drv.last_iu()).req_lim_delta, 2);
}

/// The race the port hits under load: the command finishes in the core
/// just before ABORT TASK reaches it, so the core finds nothing to abort
/// and answers FUNCTION COMPLETE while the command's GOOD completion is
/// still on its way to the channel. The TMF response must wait for it and
/// go out behind the command's data-in and response: an initiator that
/// has FUNCTION COMPLETE first ends the command as aborted and reuses its
/// buffer, which the late data-in WRITE then overwrites.
#[test]
fn abort_task_answered_before_the_command_returns_waits_behind_its_data_in() {
    let (mut t, id) = setup(cfg());
    let ch = t.channel_mut(id).unwrap();
    let mut drv = Driver {
        defer: true,
        ..Driver::default()
    };
    drv.remote.insert(4, vec![0; 4096]);
    ch.handle_recv(&cmd(
        0x20,
        DataDesc::None,
        DataDesc::Direct(d(base(4), 4, 4096)),
    ));
    ch.handle_recv(&tmf(0x21, TmFunc::AbortTask, 0x20));
    drv.run(ch);
    let victim = drv.scsi[0].cmd;
    let tm = drv.tmfs[0];
    assert_eq!(tm.task, Some(victim));
    assert!(ch.handle_tmf_done(tm.cmd, RspCode::Complete));
    assert!(
        !ch.handle_tmf_done(tm.cmd, RspCode::Complete),
        "answered once"
    );
    drv.run(ch);
    assert!(
        drv.sends.is_empty(),
        "TMF response sent while the command it aborts is still with the core"
    );
    let data = pattern(4096, 9);
    drv.in_buf.insert(victim, data.clone());
    assert!(ch.handle_scsi_done(ScsiDone::good(victim, 4096)));
    drv.run(ch);
    let order = drv.posted_kinds();
    assert_eq!(
        order,
        ["rdma", "send", "send"],
        "data-in, its response, then the TMF's"
    );
    let ius = drv.ius();
    assert_eq!(rsp(&ius[0]).tag, Tag(0x20));
    assert_eq!(rsp(&ius[0]).status, 0);
    assert_eq!(rsp(&ius[1]).tag, Tag(0x21));
    assert_eq!(rsp(&ius[1]).response_code(), Some(RspCode::Complete));
    drv.defer = false;
    drv.run(ch);
    assert_eq!(drv.remote[&4], data);
    assert_eq!(drv.released, vec![tm.cmd, victim]);
    assert_eq!(ch.initiator_credits(), ch.window());
}

/// ABORT TASK of a WRITE the backend is still executing: the core marks
/// it and answers at once, but the WRITE may still change the medium
/// until it returns (TASK ABORTED). No response before that: the
/// initiator would send the data again and a later WRITE of the same
/// blocks could be overtaken by the aborted one.
#[test]
fn abort_task_of_a_command_still_running_answers_once_it_returns() {
    let (mut t, id) = setup(cfg());
    let ch = t.channel_mut(id).unwrap();
    let mut drv = Driver::default();
    ch.handle_recv(&no_data(0x30));
    ch.handle_recv(&no_data(0x31));
    ch.handle_recv(&tmf(0x32, TmFunc::AbortTaskSet, 0));
    drv.run(ch);
    let (a, b) = (drv.scsi[0].cmd, drv.scsi[1].cmd);
    let tm = drv.tmfs[0];
    assert!(ch.handle_tmf_done(tm.cmd, RspCode::Complete));
    drv.run(ch);
    for (running, back) in [(2, a), (1, b)] {
        assert!(
            drv.sends.is_empty(),
            "answered with {running} commands still running"
        );
        assert!(ch.handle_scsi_done(ScsiDone {
            aborted: true,
            ..ScsiDone::good(back, 0)
        }));
        drv.run(ch);
    }
    assert_eq!(drv.sends.len(), 1, "only the TMF response");
    let r = rsp(&drv.last_iu());
    assert_eq!(
        (r.tag, r.response_code()),
        (Tag(0x32), Some(RspCode::Complete))
    );
    assert_eq!(r.req_lim_delta, 3);
    assert_eq!(drv.released, vec![a, b, tm.cmd]);
}

/// A command dropped by the channel itself (still fetching data-out)
/// whose READs were handed out: the TMF response waits for them even when
/// the core answers first, so no READ of the aborted command reaches the
/// initiator's memory after FUNCTION COMPLETE, whatever order the driver
/// posts work requests in.
#[test]
fn abort_task_set_answered_first_still_waits_for_posted_reads() {
    let (mut t, id) = setup(cfg());
    let ch = t.channel_mut(id).unwrap();
    let (mut drv, victim) = fetching_200k(ch);
    ch.handle_recv(&tmf(2, TmFunc::AbortTaskSet, 0));
    drv.run(ch);
    assert!(ch.handle_tmf_done(drv.tmfs[0].cmd, RspCode::Complete));
    drv.run(ch);
    for left in (1..=4).rev() {
        assert!(
            drv.sends.is_empty(),
            "TMF response with {left} READs of the aborted command posted"
        );
        assert!(drv.complete_one(ch));
    }
    assert_eq!(drv.released, vec![victim, drv.tmfs[0].cmd]);
    assert_eq!(drv.sends.len(), 1);
    let r = rsp(&drv.last_iu());
    assert_eq!((r.tag, r.req_lim_delta), (Tag(2), 2));
    assert!(drv.scsi.is_empty(), "never reached the core");
}

#[test]
fn unknown_tmf_is_not_supported_without_the_core() {
    let (mut t, id) = setup(cfg());
    let ch = t.channel_mut(id).unwrap();
    let mut drv = Driver::default();
    ch.handle_recv(&tmf(3, TmFunc::Unknown(0x77), 0));
    drv.run(ch);
    assert!(drv.tmfs.is_empty());
    let r = rsp(&drv.last_iu());
    assert_eq!(r.response_code(), Some(RspCode::NotSupported));
    assert_eq!(r.req_lim_delta, 1);
}

// ---- AER, logout -----------------------------------------------------------

#[test]
fn aer_on_lun_add_and_initiators_that_ignore_it_still_work() {
    let mut t = Target::new(cfg()).unwrap();
    let (a, _) = accept(&mut t, &req(1, MultiChannelAction::Single, false));
    let (b, _) = accept(&mut t, &req(2, MultiChannelAction::Single, false));
    assert_eq!(t.notify(AerEvent::LunsChanged), 2);
    assert_eq!(t.notify(AerEvent::CapacityChanged(Lun::from_u64(3))), 2);
    let mut da = Driver::default();
    let mut db = Driver::default();
    da.run(t.channel_mut(a).unwrap());
    db.run(t.channel_mut(b).unwrap());
    for drv in [&da, &db] {
        assert_eq!(drv.sends.len(), 1, "one AER outstanding at a time");
        match drv.last_iu() {
            Iu::AerReq(r) => {
                assert_eq!(r.req_lim_delta, 0);
                assert_eq!(
                    (r.sense_data[2], r.sense_data[12], r.sense_data[13]),
                    (6, 0x3f, 0x0e)
                );
            }
            other => panic!("{other:?}"),
        }
    }
    // `a` answers and gets the capacity event next.
    let tag = da.last_iu().tag();
    let cha = t.channel_mut(a).unwrap();
    cha.handle_recv(&Iu::AerRsp(AerRsp { tag }).to_vec().unwrap());
    da.run(cha);
    match da.last_iu() {
        Iu::AerReq(r) => {
            assert_eq!(r.lun, Lun::from_u64(3));
            assert_eq!((r.sense_data[12], r.sense_data[13]), (0x2a, 0x09));
        }
        other => panic!("{other:?}"),
    }
    // `b` never answers: commands still run with full credit.
    let chb = t.channel_mut(b).unwrap();
    chb.handle_recv(&no_data(1));
    db.run(chb);
    assert!(chb.handle_scsi_done(ScsiDone::good(db.scsi[0].cmd, 0)));
    db.run(chb);
    assert_eq!(rsp(&db.last_iu()).req_lim_delta, 1);
    assert_eq!(chb.initiator_credits(), chb.window());
}

#[test]
fn shutdown_and_lun_map_removal_send_t_logout() {
    let mut t = Target::new(cfg()).unwrap();
    let (a, _) = accept(&mut t, &req(1, MultiChannelAction::Single, false));
    let (b, _) = accept(&mut t, &req(2, MultiChannelAction::Single, false));
    assert_eq!(t.logout_initiator(port(1), TLogoutReason::NoReason), 1);
    let mut da = Driver::default();
    da.run(t.channel_mut(a).unwrap());
    assert_eq!(t_logout(&da.last_iu()), TLogoutReason::NoReason);
    assert_eq!(da.disconnects, 1);
    assert_eq!(t.channel(b).unwrap().state(), ChannelState::Live);

    t.shutdown(TLogoutReason::NoReason);
    let mut db = Driver::default();
    db.run(t.channel_mut(b).unwrap());
    assert_eq!(db.disconnects, 1);
    assert_eq!(
        rejected(&mut t, &req(3, MultiChannelAction::Single, false)),
        LoginRejReason::InsufficientResources
    );
}

#[test]
fn i_logout_aborts_and_disconnects_without_t_logout() {
    let (mut t, id) = setup(cfg());
    let ch = t.channel_mut(id).unwrap();
    let mut drv = Driver::default();
    ch.handle_recv(&no_data(1));
    ch.handle_recv(&Iu::ILogout(ILogout { tag: Tag(2) }).to_vec().unwrap());
    drv.run(ch);
    assert!(drv.sends.is_empty());
    assert_eq!(drv.aborts, vec![drv.scsi[0].cmd]);
    assert_eq!(drv.released, vec![drv.scsi[0].cmd]);
    assert_eq!(drv.disconnects, 1);
    ch.handle_recv(&no_data(3));
    drv.run(ch);
    assert_eq!(drv.scsi.len(), 1, "nothing accepted after logout");
}

// ---- hostile input ---------------------------------------------------------

#[test]
fn protocol_violations_log_out_with_the_r16a_reason() {
    let mut long = no_data(1);
    long.resize(4149, 0);
    let cases: Vec<(Vec<u8>, TLogoutReason)> = vec![
        (vec![0x55; 48], TLogoutReason::InvalidIuType),
        (vec![], TLogoutReason::InvalidIuLength),
        (long, TLogoutReason::InvalidIuLength),
        (no_data(1)[..40].to_vec(), TLogoutReason::InvalidIuLength),
        (
            tmf(1, TmFunc::AbortTask, 0)[..20].to_vec(),
            TLogoutReason::InvalidIuLength,
        ),
        (vec![0xc1; 36], TLogoutReason::InvalidIuType), // SRP_RSP from an initiator
        (
            {
                let mut b = [0u8; 64];
                req(1, MultiChannelAction::Single, false)
                    .emit(&mut b)
                    .unwrap();
                b.to_vec()
            },
            TLogoutReason::InvalidIuType,
        ),
        (
            Iu::AerRsp(AerRsp { tag: Tag(1) }).to_vec().unwrap(),
            TLogoutReason::SpuriousResponse,
        ),
        (
            {
                let mut b = no_data(1);
                b[5] = 0x70; // data-out format 7
                b
            },
            TLogoutReason::UnsupportedDataOutFormat,
        ),
        (
            {
                let mut b = no_data(1);
                b[5] = 0x03; // immediate as a data-in format
                b
            },
            TLogoutReason::UnsupportedDataInFormat,
        ),
    ];
    let mut t = Target::new(cfg()).unwrap();
    let (bystander, _) = accept(&mut t, &req(100, MultiChannelAction::Single, false));
    for (i, (iu, reason)) in cases.into_iter().enumerate() {
        let (id, _) = accept(
            &mut t,
            &req(i as u64 + 1, MultiChannelAction::Single, false),
        );
        let ch = t.channel_mut(id).unwrap();
        let mut drv = Driver::default();
        ch.handle_recv(&iu);
        drv.run(ch);
        assert_eq!(t_logout(&drv.last_iu()), reason, "case {i}");
        assert_eq!(drv.disconnects, 1, "case {i}");
        ch.disconnected();
        assert!(t.remove(id));
    }
    let ch = t.channel_mut(bystander).unwrap();
    let mut drv = Driver::default();
    ch.handle_recv(&no_data(1));
    drv.run(ch);
    assert_eq!(drv.scsi.len(), 1, "other sessions unaffected");
}

#[test]
fn malformed_commands_get_check_condition_and_keep_the_channel() {
    let (mut t, id) = setup(cfg());
    let ch = t.channel_mut(id).unwrap();
    let mut drv = Driver::default();
    let mut add_cdb = no_data(1);
    add_cdb[31] = 10 << 2; // 40 bytes of additional CDB that are not there
    let mut too_big = cmd(2, DataDesc::Direct(d(0, 1, u32::MAX)), DataDesc::None);
    too_big[4] = 0;
    let mut list = Vec::new();
    DescList::encode(&[d(0, 1, 10)], &mut list);
    let mismatch = cmd(
        3,
        DataDesc::None,
        DataDesc::Indirect(IndirectBuf {
            table: d(0, 0, 16),
            total_len: 11,
            descs: DescList::new(&list).unwrap(),
        }),
    );
    for iu in [add_cdb, too_big, mismatch] {
        ch.handle_recv(&iu);
    }
    ch.handle_recv(&no_data(7));
    ch.handle_recv(&no_data(7)); // overlapped tag
    drv.run(ch);
    let ius = drv.ius();
    let got: Vec<(u64, u8, [u8; 2])> = ius
        .iter()
        .map(|i| {
            let r = rsp(i);
            let s = r.sense_data.unwrap();
            (r.tag.0, r.status, [s[12], s[13]])
        })
        .collect();
    assert_eq!(
        got,
        vec![
            (1, 2, [0x0e, 3]),
            (2, 2, [0x0e, 3]),
            (3, 2, [0x0e, 3]),
            (7, 2, [0x4e, 0])
        ]
    );
    assert_eq!(ch.state(), ChannelState::Live);
    assert_eq!(ch.stats().bad_cmds, 4);
    assert_eq!(drv.scsi.len(), 1);
    assert_eq!(ch.in_flight(), 1);
}

#[test]
fn disconnect_mid_transfer_releases_everything() {
    let (mut t, id) = setup(cfg());
    let (other, _) = accept(&mut t, &req(2, MultiChannelAction::Single, false));
    let ch = t.channel_mut(id).unwrap();
    let mut drv = Driver {
        defer: true,
        ..Driver::default()
    };
    drv.remote.insert(1, vec![0; 1 << 20]);
    ch.handle_recv(&cmd(
        1,
        DataDesc::Direct(d(base(1), 1, 300_000)),
        DataDesc::None,
    ));
    ch.handle_recv(&no_data(2));
    ch.handle_recv(&cmd(
        3,
        DataDesc::None,
        DataDesc::Direct(d(base(1), 1, 200_000)),
    ));
    drv.run(ch);
    let in_core: Vec<CmdId> = drv.scsi.iter().map(|r| r.cmd).collect();
    assert_eq!(in_core.len(), 2);
    drv.in_buf.insert(in_core[1], vec![5; 200_000]);
    assert!(ch.handle_scsi_done(ScsiDone::good(in_core[1], 200_000)));
    drv.run(ch);
    let reading = drv.rdma_log[0].1.cmd;
    // The initiator vanishes with READs and WRITEs posted.
    ch.disconnected();
    drv.run(ch);
    assert_eq!(drv.aborts, vec![in_core[0]]);
    let mut rel = drv.released.clone();
    rel.sort();
    let mut want = vec![reading, in_core[0], in_core[1]];
    want.sort();
    assert_eq!(rel, want);
    assert_eq!(drv.disconnects, 0);
    // Flushed completions after that are ignored.
    let ops: Vec<OpId> = drv.rdma_log.iter().map(|(_, o)| o.id).collect();
    for op in ops {
        ch.handle_rdma_done(op, false);
    }
    assert!(ch.poll_output().is_none());
    assert!(t.remove(id));
    assert_eq!(t.channel(other).unwrap().state(), ChannelState::Live);
    assert_eq!(t.credits_promised(), u64::from(128 + RESERVED_RECV));
}

#[test]
fn a_failed_work_request_closes_the_channel_after_the_flush() {
    let (mut t, id) = setup(cfg());
    let ch = t.channel_mut(id).unwrap();
    let mut drv = Driver {
        defer: true,
        ..Driver::default()
    };
    drv.remote.insert(1, vec![0; 1 << 20]);
    ch.handle_recv(&cmd(
        1,
        DataDesc::Direct(d(base(1), 1, 200_000)),
        DataDesc::None,
    ));
    drv.run(ch);
    let ops: Vec<OpId> = drv.rdma_log.iter().map(|(_, o)| o.id).collect();
    assert_eq!(ops.len(), 4);
    ch.handle_rdma_done(ops[0], false);
    drv.pending.clear();
    drv.run(ch);
    assert_eq!(ch.state(), ChannelState::Closing);
    assert!(drv.released.is_empty() && drv.disconnects == 0);
    for op in &ops[1..] {
        ch.handle_rdma_done(*op, false);
    }
    drv.run(ch);
    assert_eq!(drv.released.len(), 1);
    assert_eq!(drv.disconnects, 1);
    assert!(drv.sends.is_empty(), "no T_LOGOUT on a QP in error");
}

#[test]
fn solicited_notification_follows_the_command_bits() {
    let (mut t, id) = setup(cfg());
    let ch = t.channel_mut(id).unwrap();
    let mut drv = Driver::default();
    let mut a = no_data(1);
    a[1] = sol_not::SCSOLNT;
    let mut b = no_data(2);
    b[1] = sol_not::SCSOLNT;
    ch.handle_recv(&a);
    ch.handle_recv(&b);
    drv.run(ch);
    assert!(ch.handle_scsi_done(ScsiDone::good(drv.scsi[0].cmd, 0)));
    assert!(ch.handle_scsi_done(ScsiDone {
        status: 2,
        ..ScsiDone::good(drv.scsi[1].cmd, 0)
    }));
    drv.run(ch);
    assert_eq!(drv.solicited, vec![true, false]);
    assert_eq!(rsp(&drv.ius()[0]).sol_not, sol_not::SOLNT);
}
