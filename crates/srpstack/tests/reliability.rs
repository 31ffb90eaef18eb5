//! System-level reliability (issue 10 item 4): the target and initiators in
//! this process over the soft RoCE NIC, each test on its own loopback
//! addresses (127.0.91.x to 127.0.94.x), every data check a verification
//! (blockload stamps or an explicit compare).
//!
//! - 1 % packet loss on both NICs under verified random I/O, and loss with
//!   duplication, reordering and bit flips;
//! - a rogue initiator sending malformed IUs and absurd logins next to a
//!   good one doing verified I/O; absurd RDMA CM logins to `srptd`;
//! - LOGICAL UNIT RESET from another initiator while verified I/O runs;
//! - LUN 1 added and removed repeatedly while verified I/O runs on LUN 0;
//! - `srptd` SIGKILLed under I/O, then restarted.
//!
//! Short by default (CI); `SRP_RELIABILITY_LONG=1` runs longer and bigger.
//! Large transfers (4 and 8 MiB, cmd_sg_entries 1 and 255, discontiguous
//! buffers) are covered by `srp-initiator/tests/e2e_loopback.rs`.

mod common;

use blockload::BlockDevice;
use rdma_types::{AccessFlags, Guid, Lid, PortNum, Psn, QpState, QpType, WcOpcode, WcStatus};
use rnic::softroce::{FaultConfig, SoftCa, SoftRoce, ROCE_PORT};
use srp::initiator::{ChannelConfig, Status};
use srp::target::{AerEvent, LoginForm as TargetForm, TargetConfig};
use srp::wire::{
    Cmd, DataDesc, DirectBuf, Iu, LoginReq, Lun, RspCode, TLogoutReason, Tag, TaskAttr, TmFunc,
    TskMgmt,
};
use srp_initiator::disk::{describe, sense_triple, Disk};
use srp_initiator::session::{CmdResult, Session, SessionConfig, Xfer};
use srp_target::{ConnId, LoginOutcome, PeerQp, PortOptions, TargetPort};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use verbs::{
    AhAttr, CaHandle, CqHandle, CqInit, MemBuf, MrInfo, PdHandle, Provider, QpAttr, QpCaps,
    QpHandle, QpInit, RecvWr, SendOpcode, SendWr, Sge, WorkCompletion,
};

const TGT: u64 = 0x0002_c903_00a0_0901;
const GOOD: u64 = 0x0002_c903_00b0_0902;
const ROGUE: u64 = 0x0002_c903_00b0_0903;
const THIRD: u64 = 0x0002_c903_00b0_0904;
const MIB: u64 = 1 << 20;

fn long() -> bool {
    std::env::var_os("SRP_RELIABILITY_LONG").is_some_and(|v| v != "0")
}

/// A target port with LUN 0 (RAM) on 127.0.`net`.1 and initiator CAs on
/// .2 (good), .3 (rogue), .4 (third), one soft RoCE provider.
struct Rig {
    p: Arc<SoftRoce>,
    scsi: Arc<scsi::Target>,
    port: Arc<TargetPort>,
}

fn ram_device(bytes: u64, serial: &str) -> Arc<scsi::Device> {
    let cfg = scsi::DeviceConfig {
        block_size: 512,
        serial: serial.into(),
        ..Default::default()
    };
    Arc::new(scsi::Device::new(cfg, Arc::new(scsi::Ram::new(bytes))).unwrap())
}

fn chan(guid: u64, ext: u64) -> ChannelConfig {
    ChannelConfig::new(ext, Guid(guid), TGT, Guid(TGT))
}

fn rig(net: u8, lun0: u64, faults: &[(u64, FaultConfig)]) -> Rig {
    rig_at(net, 0, lun0, faults)
}

/// [`rig`] with the CAs on 127.0.`net`.(`base` + 1..=4).
fn rig_at(net: u8, base: u8, lun0: u64, faults: &[(u64, FaultConfig)]) -> Rig {
    let ca = |guid: u64, last: u8| SoftCa {
        guid: Guid(guid),
        ip: std::net::Ipv4Addr::new(127, 0, net, base + last).into(),
    };
    let p = SoftRoce::new(
        vec![ca(TGT, 1), ca(GOOD, 2), ca(ROGUE, 3), ca(THIRD, 4)],
        ROCE_PORT,
    );
    for (guid, f) in faults {
        p.set_faults(Guid(*guid), Some(f.clone())).unwrap();
    }
    let scsi = Arc::new(scsi::Target::new());
    scsi.add_lun(
        None,
        scsi::Lun::new(0).unwrap(),
        ram_device(lun0, "rel-lun0"),
    );
    let tcfg = TargetConfig::new(chan(GOOD, 1).target_port_id(), "reliability");
    let port = TargetPort::start(
        p.clone(),
        Guid(TGT),
        tcfg,
        scsi.clone(),
        PortOptions::default(),
    )
    .unwrap();
    Rig {
        p,
        scsi,
        port: Arc::new(port),
    }
}

impl Rig {
    fn session(&self, guid: u64, ext: u64) -> Arc<Session> {
        self.session_with(guid, chan(guid, ext))
    }

    fn session_with(&self, guid: u64, c: ChannelConfig) -> Arc<Session> {
        let direct = Arc::new(srpstack::Direct::new(self.port.clone(), Lid(0)));
        let s =
            Session::connect(self.p.clone(), Guid(guid), direct, SessionConfig::new(c)).unwrap();
        Arc::new(s)
    }
}

fn lun(n: u64) -> Lun {
    Lun::from_u64(n << 48)
}

/// Why commands were sent again, as the SCSI midlayer would.
#[derive(Default, Debug)]
struct Retries {
    task_aborted: AtomicU64,
    reset_ended: AtomicU64,
    /// Timed out and aborted by the session's error handler.
    eh_aborted: AtomicU64,
    busy: AtomicU64,
    /// UNIT ATTENTION 29h (power on, reset, BUS DEVICE RESET FUNCTION).
    ua_reset: AtomicU64,
    /// UNIT ATTENTION 3Fh/0Eh (REPORTED LUNS DATA HAS CHANGED).
    ua_luns_changed: AtomicU64,
    ua_other: AtomicU64,
}

/// Runs a command, sending it again after TASK ABORTED, BUSY, TASK SET
/// FULL, a reset, an abort by the error handler after a timeout, or a unit
/// attention (at most 50 times), as the SCSI midlayer does. Anything else
/// that is not GOOD is an error.
fn exec(
    s: &Session,
    lun: Lun,
    cdb: &[u8],
    mut xfer: Xfer<'_>,
    r: &Retries,
) -> io::Result<CmdResult> {
    for _ in 0..50 {
        let res = s
            .execute(lun, cdb, xfer.reborrow())
            .map_err(|e| io::Error::other(format!("{e}")))?;
        if res.good() {
            return Ok(res);
        }
        let counter = match res.status {
            Status::Scsi(0x40) => &r.task_aborted,
            Status::Scsi(0x08) | Status::Scsi(0x28) => &r.busy,
            Status::Reset => &r.reset_ended,
            Status::Aborted => &r.eh_aborted,
            Status::Scsi(0x02) => match sense_triple(&res.sense) {
                (0x6, 0x29, _) => &r.ua_reset,
                (0x6, 0x3f, 0x0e) => &r.ua_luns_changed,
                (0x6, _, _) => &r.ua_other,
                _ => return Err(io::Error::other(describe(&res))),
            },
            _ => return Err(io::Error::other(describe(&res))),
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
    Err(io::Error::other("still refused after 50 tries"))
}

/// LUN 0 of a session as a block device through [`exec`].
struct Retrying {
    s: Arc<Session>,
    lun: Lun,
    blocks: u64,
    r: Arc<Retries>,
}

fn rw16(op: u8, lba: u64, blocks: usize) -> [u8; 16] {
    let mut cdb = [0u8; 16];
    cdb[0] = op;
    cdb[2..10].copy_from_slice(&lba.to_be_bytes());
    cdb[10..14].copy_from_slice(&(blocks as u32).to_be_bytes());
    cdb
}

impl BlockDevice for Retrying {
    fn block_size(&self) -> u32 {
        512
    }
    fn num_blocks(&self) -> u64 {
        self.blocks
    }
    fn read_at(&self, lba: u64, buf: &mut [u8]) -> io::Result<()> {
        let cdb = rw16(0x88, lba, buf.len() / 512);
        let res = exec(&self.s, self.lun, &cdb, Xfer::In(buf.len()), &self.r)?;
        if res.data.len() != buf.len() {
            return Err(io::Error::other("short read"));
        }
        buf.copy_from_slice(&res.data);
        Ok(())
    }
    fn write_at(&self, lba: u64, buf: &[u8]) -> io::Result<()> {
        let cdb = rw16(0x8a, lba, buf.len() / 512);
        exec(&self.s, self.lun, &cdb, Xfer::Out(buf), &self.r).map(|_| ())
    }
}

fn retrying(s: &Arc<Session>, r: &Arc<Retries>) -> Arc<Retrying> {
    // Disk::open clears the new nexus's unit attentions and reads the size.
    let disk = Disk::open(s.clone(), 0).unwrap();
    assert_eq!(disk.info().block_size, 512);
    Arc::new(Retrying {
        s: s.clone(),
        lun: lun(0),
        blocks: disk.info().blocks,
        r: r.clone(),
    })
}

fn randrw(region: u64, size: u64, bs: u32, jobs: u32, seed: u64) -> blockload::Workload {
    let mut w = blockload::Workload::new(blockload::Pattern::RandRw { read_pct: 50 });
    w.bs = bs;
    w.jobs = jobs;
    w.verify = true;
    w.region = Some(region);
    w.size = Some(size);
    w.runtime = Duration::from_secs(if long() { 600 } else { 60 });
    w.seed = seed;
    w
}

/// Verified workloads back to back on `dev` until `stop` is set, then one
/// more, so the load covers whatever ran meanwhile.
fn load_until(
    dev: Arc<dyn blockload::BlockDevice>,
    w: blockload::Workload,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<Vec<blockload::Report>> {
    std::thread::spawn(move || {
        let mut reports = Vec::new();
        loop {
            let last = stop.load(Ordering::SeqCst);
            let mut w = w.clone();
            w.seed = w.seed.wrapping_add(reports.len() as u64);
            reports.push(blockload::run(dev.clone(), &w, |_| {}).unwrap());
            if last || !reports.last().unwrap().ok() {
                return reports;
            }
        }
    })
}

/// Every run clean; returns the verified bytes.
fn check_reports(what: &str, reports: &[blockload::Report]) -> u64 {
    let mut verified = 0;
    for r in reports {
        assert_eq!(r.verify_failures, 0, "{what}: {}", r.table());
        assert_eq!(r.io_errors, 0, "{what}: {}", r.table());
        verified += r.verified_bytes;
    }
    assert!(verified > 0, "{what}: nothing verified");
    verified
}

fn pattern(len: usize, salt: u64) -> Vec<u8> {
    (0..len as u64)
        .map(|i| ((i * 31) ^ (i >> 9) ^ salt) as u8)
        .collect()
}

/// Polls `cond` until it holds or `secs` pass.
fn wait_until(secs: u64, what: &str, mut cond: impl FnMut() -> bool) {
    let end = Instant::now() + Duration::from_secs(secs);
    while !cond() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn one_percent_loss_on_both_nics_verified_randrw() {
    let loss = |seed| FaultConfig::lossy(seed, 0.01);
    let rig = rig(91, 32 * MIB, &[(TGT, loss(0x91)), (GOOD, loss(0x92))]);
    let s = rig.session(GOOD, 1);
    let disk = Arc::new(Disk::open(s.clone(), 0).unwrap());
    let size = if long() { 2048 * MIB } else { 128 * MIB };
    let w = randrw(16 * MIB, size, 64 << 10, 4, 0x1055);
    let r = blockload::run(disk.clone(), &w, |_| {}).unwrap();
    println!("{}", r.table());
    assert_eq!(r.verify_failures, 0, "{}", r.table());
    assert_eq!(r.io_errors, 0, "{}", r.table());
    assert_eq!(r.read.bytes + r.write.bytes, size, "{}", r.table());
    assert!(r.verified_bytes >= MIB, "{}", r.table());
    // Large transfers through the lossy link, compared byte for byte.
    for (lba, mib) in [(32768u64, 4usize), (40960, 8)] {
        let data = pattern(mib << 20, lba);
        disk.write(lba, &data).unwrap();
        let mut back = vec![0u8; data.len()];
        disk.read(lba, &mut back).unwrap();
        assert!(back == data, "{mib} MiB read back differs");
    }
    let (t, i) = (
        rig.p.counters(Guid(TGT)).unwrap(),
        rig.p.counters(Guid(GOOD)).unwrap(),
    );
    println!(
        "target NIC: {t:?}\ninitiator NIC: {i:?}\nsession: {:?}",
        s.stats()
    );
    assert!(
        t.retransmits + i.retransmits > 0,
        "1% loss must have cost retransmissions: {t:?} {i:?}"
    );
    assert!(!s.is_closed());
}

/// Duplicated, reordered and corrupted datagrams on top of loss, on both
/// NICs: the ICRC drops the corrupted ones, RC sequencing the rest; the
/// data stays right.
#[test]
fn duplicates_reordering_and_corruption_verified_randrw() {
    let faults = |seed| FaultConfig {
        seed,
        loss: 0.005,
        duplicate: 0.01,
        reorder: 0.01,
        reorder_delay: rdma_types::Duration::from_micros(300),
        corrupt: 0.005,
        ..Default::default()
    };
    let rig = rig_at(91, 10, 32 * MIB, &[(TGT, faults(7)), (GOOD, faults(8))]);
    let s = rig.session(GOOD, 1);
    let disk = Arc::new(Disk::open(s.clone(), 0).unwrap());
    let size = if long() { 1024 * MIB } else { 64 * MIB };
    let r = blockload::run(
        disk.clone(),
        &randrw(16 * MIB, size, 64 << 10, 4, 0xd0b),
        |_| {},
    )
    .unwrap();
    println!("{}", r.table());
    assert_eq!(r.verify_failures, 0, "{}", r.table());
    assert_eq!(r.io_errors, 0, "{}", r.table());
    assert_eq!(r.read.bytes + r.write.bytes, size, "{}", r.table());
    assert!(r.verified_bytes >= MIB, "{}", r.table());
    let data = pattern(8 << 20, 0xc0);
    disk.write(40960, &data).unwrap();
    let mut back = vec![0u8; data.len()];
    disk.read(40960, &mut back).unwrap();
    assert!(back == data, "8 MiB read back differs");
    let (t, i) = (
        rig.p.counters(Guid(TGT)).unwrap(),
        rig.p.counters(Guid(GOOD)).unwrap(),
    );
    println!("target NIC: {t:?}\ninitiator NIC: {i:?}");
    assert!(
        t.rx_bad_icrc + i.rx_bad_icrc > 0,
        "corruption unseen: {t:?} {i:?}"
    );
    assert!(t.duplicates + i.duplicates > 0, "{t:?} {i:?}");
    assert!(!s.is_closed());
}

/// Raw verbs on an RC QP logged in through the target's login path: an
/// initiator that sends whatever it is told to.
struct Raw {
    p: Arc<dyn Provider>,
    port: Arc<TargetPort>,
    ca: CaHandle,
    pd: PdHandle,
    cq: CqHandle,
    qp: QpHandle,
    buf: MemBuf,
    mr: MrInfo,
    conn: ConnId,
    max_it_iu_len: u32,
    next: u64,
}

const SLOT: usize = 8192;
const RECVS: u32 = 16;
const SEND_AREA: usize = 96 << 10;

/// What the target did about an IU.
#[derive(Debug)]
enum Reaction {
    Iu(Vec<u8>),
    Failed(WcStatus),
    Silence,
}

fn login_bytes(req: &LoginReq) -> Vec<u8> {
    let mut b = vec![0u8; 64];
    let n = req.emit_rdma(&mut b).unwrap();
    b.truncate(n);
    b
}

fn valid_login(guid: u64, ext: u64) -> LoginReq {
    srp::initiator::Channel::new(chan(guid, ext))
        .unwrap()
        .login_request()
        .unwrap()
}

impl Raw {
    fn login(rig: &Rig, guid: u64, ext: u64) -> Raw {
        let p: Arc<dyn Provider> = rig.p.clone();
        let ca = p
            .open_ca(Guid(guid), 0, Arc::new(verbs::IgnoreEvents))
            .unwrap();
        let attr = p.query_port(ca, PortNum(1)).unwrap();
        let pd = p.alloc_pd(ca, 0).unwrap();
        let cq = p.create_cq(pd, &CqInit { cqe: 256 }, 0).unwrap();
        let init = QpInit {
            qp_type: QpType::Rc,
            send_cq: cq,
            recv_cq: cq,
            srq: None,
            caps: QpCaps {
                max_send_wr: 64,
                max_recv_wr: RECVS,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline: 0,
            },
            sq_sig_all: true,
            port: None,
        };
        let qp = p.create_qp(pd, &init, 0).unwrap();
        p.modify_qp(
            qp,
            &QpAttr {
                state: Some(QpState::Init),
                port: Some(PortNum(1)),
                pkey_index: Some(0),
                access: Some(AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE),
                ..Default::default()
            },
        )
        .unwrap();
        let buf = MemBuf::new(RECVS as usize * SLOT + SEND_AREA);
        let access =
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE;
        let mr = p
            .reg_mr(pd, &buf, buf.addr(), buf.len() as u64, access, 0)
            .unwrap();
        let psn = Psn::new(0x4400 + ext as u32);
        let peer = PeerQp {
            qpn: p.qp_num(qp).unwrap(),
            psn,
            gid: attr.gids[0],
            lid: Lid(0),
            mtu: attr.active_mtu,
            initiator_depth: 16,
            ack_timeout: 14,
            local_psn: None,
        };
        let login = login_bytes(&valid_login(guid, ext));
        let (conn, local, rsp) = match rig.port.login(&login, TargetForm::RdmaCm, peer) {
            LoginOutcome::Accepted { conn, local, rsp } => (conn, local, rsp),
            LoginOutcome::Rejected { reason, .. } => panic!("rogue login refused: {reason}"),
        };
        rig.port.established(conn);
        let rsp = srp::wire::LoginRsp::parse(&rsp).unwrap();
        let raw = Raw {
            p: p.clone(),
            port: rig.port.clone(),
            ca,
            pd,
            cq,
            qp,
            buf,
            mr,
            conn,
            max_it_iu_len: rsp.max_it_iu_len,
            next: 0,
        };
        for i in 0..RECVS {
            raw.post_recv(i as u64);
        }
        let rtr = QpAttr {
            state: Some(QpState::Rtr),
            av: Some(AhAttr::roce(rig.port.gid())),
            path_mtu: Some(attr.active_mtu),
            dest_qpn: Some(local.qpn),
            rq_psn: Some(psn),
            max_dest_rd_atomic: Some(16),
            min_rnr_timer: Some(12),
            ..Default::default()
        };
        let rts = QpAttr {
            state: Some(QpState::Rts),
            sq_psn: Some(local.psn),
            timeout: Some(14),
            retry_cnt: Some(7),
            rnr_retry: Some(7),
            max_rd_atomic: Some(0),
            ..Default::default()
        };
        p.modify_qp(qp, &rtr).unwrap();
        p.modify_qp(qp, &rts).unwrap();
        raw
    }

    fn post_recv(&self, i: u64) {
        let wr = RecvWr {
            wr_id: i,
            sges: verbs::sges![Sge {
                addr: self.buf.addr() + i * SLOT as u64,
                length: SLOT as u32,
                lkey: self.mr.lkey,
            }],
        };
        self.p.post_recv(self.qp, &[wr]).unwrap();
    }

    fn send(&mut self, iu: &[u8]) {
        assert!(iu.len() <= SEND_AREA);
        let at = RECVS as usize * SLOT;
        self.buf.write_at(at, iu);
        self.next += 1;
        let sges = if iu.is_empty() {
            Vec::new()
        } else {
            vec![Sge {
                addr: self.buf.addr() + at as u64,
                length: iu.len() as u32,
                lkey: self.mr.lkey,
            }]
        };
        let wr = SendWr::new(1 << 32 | self.next, SendOpcode::Send, sges);
        self.p.post_send(self.qp, &[wr]).unwrap();
    }

    /// The next IU from the target, or the failure of this QP, within 10 s.
    fn next(&self) -> Reaction {
        let end = Instant::now() + Duration::from_secs(10);
        let mut wc = [WorkCompletion::new(0, WcStatus::Success, WcOpcode::Send, 0)];
        while Instant::now() < end {
            if self.p.poll_cq(self.cq, &mut wc).unwrap() == 0 {
                let _ = self.p.wait_cq(self.cq, Duration::from_millis(20));
                continue;
            }
            let c = wc[0];
            if c.status != WcStatus::Success {
                return Reaction::Failed(c.status);
            }
            if c.opcode == WcOpcode::Recv {
                let i = c.wr_id;
                let iu = self.buf.to_vec(i as usize * SLOT, c.byte_len as usize);
                self.post_recv(i);
                return Reaction::Iu(iu);
            }
        }
        Reaction::Silence
    }

    /// The next IU that is not an unsolicited target request.
    fn answer(&self) -> Reaction {
        loop {
            match self.next() {
                // SRP_CRED_REQ and SRP_AER_REQ are left unanswered.
                Reaction::Iu(b) if matches!(b.first(), Some(0x81) | Some(0x82)) => continue,
                r => return r,
            }
        }
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        // As a CM DREQ would: the target releases the channel.
        self.port.disconnected(self.conn);
        let p = &self.p;
        let _ = p.destroy_qp(self.qp);
        let _ = p.dereg_mr(self.mr.handle);
        let _ = p.destroy_cq(self.cq);
        let _ = p.dealloc_pd(self.pd);
        let _ = p.close_ca(self.ca);
    }
}

fn cmd_iu(tag: u64, cdb: &[u8], out: DataDesc<'_>, inn: DataDesc<'_>) -> Vec<u8> {
    cmd_iu_at(0, tag, cdb, out, inn)
}

/// [`cmd_iu`] for LUN `n`.
fn cmd_iu_at(n: u64, tag: u64, cdb: &[u8], out: DataDesc<'_>, inn: DataDesc<'_>) -> Vec<u8> {
    let c = Cmd {
        sol_not: 0,
        tag: Tag(tag),
        lun: lun(n),
        task_attr: TaskAttr::Simple,
        cdb,
        data_out: out,
        data_in: inn,
    };
    let mut b = vec![0u8; c.buffer_len()];
    let n = c.emit(&mut b).unwrap();
    b.truncate(n);
    b
}

/// Status and task management response code (RSPVALID) of the SRP_RSP
/// the target answers `tag` with.
fn rsp(raw: &mut Raw, tag: u64) -> (u8, Option<RspCode>) {
    match raw.answer() {
        Reaction::Iu(b) => match Iu::parse(&b, None) {
            Ok(Iu::Rsp(r)) if r.tag == Tag(tag) => {
                (r.status, r.response_data.map(|d| RspCode::from(d[3])))
            }
            other => panic!("tag {tag}: {other:?}"),
        },
        other => panic!("tag {tag}: {other:?}"),
    }
}

fn tmf_iu(tag: u64, func: TmFunc) -> Vec<u8> {
    let t = TskMgmt {
        sol_not: 0,
        tag: Tag(tag),
        lun: lun(0),
        func,
        task_tag: Tag(0),
    };
    let mut b = vec![0u8; t.buffer_len()];
    t.emit(&mut b).unwrap();
    b
}

/// What an attack must produce.
#[derive(Debug, Clone, Copy)]
enum Expect {
    /// SRP_T_LOGOUT with this reason, or the QP failing (the target closed it).
    Logout(Option<TLogoutReason>),
    /// An SRP_RSP for `tag` that is not GOOD.
    Refused(u64),
}

/// Checks a reaction; returns it in words.
fn judge(what: &str, r: &Reaction, want: Expect) -> String {
    let iu = match r {
        Reaction::Silence => panic!("{what}: the target did not react"),
        Reaction::Failed(st) => {
            assert!(
                !matches!(want, Expect::Refused(_)),
                "{what}: wanted an SRP_RSP, the QP failed ({st:?})"
            );
            return format!("QP closed ({st:?})");
        }
        Reaction::Iu(b) => Iu::parse(b, None).unwrap_or_else(|e| panic!("{what}: {e}")),
    };
    match (&iu, want) {
        (Iu::TLogout(t), Expect::Logout(Some(reason))) => {
            assert_eq!(t.reason, reason, "{what}")
        }
        (Iu::TLogout(_), Expect::Logout(None)) => {}
        (Iu::Rsp(rsp), Expect::Refused(tag)) => {
            assert_eq!(rsp.tag, Tag(tag), "{what}");
            assert_ne!(rsp.status, 0, "{what}: answered GOOD");
        }
        _ => panic!("{what}: wanted {want:?}, got {iu:?}"),
    }
    match iu {
        Iu::TLogout(t) => format!("SRP_T_LOGOUT ({})", t.reason),
        Iu::Rsp(r) => format!("SRP_RSP status {:#04x}", r.status),
        other => format!("{:?}", other.iu_type()),
    }
}

#[test]
fn rogue_initiator_garbage_next_to_verified_io() {
    let rig = rig(92, 16 * MIB, &[]);
    // LUN 1, before anyone logs in: a memory store, whose READs go out of
    // it as srptd's RAM LUNs' do (unsignaled WRITEs, joined).
    let cfg = scsi::DeviceConfig {
        block_size: 512,
        serial: "rel-mem1".into(),
        ..Default::default()
    };
    let store = Arc::new(srp_target::MemStore::new(MIB).unwrap());
    rig.scsi.add_lun(
        None,
        scsi::Lun::new(1).unwrap(),
        Arc::new(scsi::Device::new(cfg, store).unwrap()),
    );
    // Keeps the rogue's NIC open across its logins: closing a soft RoCE CA
    // for the last time may leave its socket bound for a moment (the
    // driver thread can hold the last reference), so a reopen right after
    // can fail with EADDRINUSE.
    let keeper = rig
        .p
        .open_ca(Guid(ROGUE), 0, Arc::new(verbs::IgnoreEvents))
        .unwrap();
    let good = rig.session(GOOD, 1);
    let r = Arc::new(Retries::default());
    let dev = retrying(&good, &r);
    // The rogue aims at blocks above the good region; they hold a known
    // pattern, which must be unchanged afterwards.
    let fence_lba = 12 * MIB / 512;
    let fence = pattern(MIB as usize, 0xfe);
    dev.write_at(fence_lba, &fence).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let load = load_until(
        dev.clone(),
        randrw(2 * MIB, 4 * MIB, 16 << 10, 2, 0x7067),
        stop.clone(),
    );

    // Absurd logins, as a CM would hand them over: all refused.
    let peer = PeerQp {
        qpn: rdma_types::Qpn::from_bits(0x99),
        psn: Psn::new(1),
        gid: rdma_types::Gid::from_ip(std::net::Ipv4Addr::new(127, 0, 92, 3).into()),
        lid: Lid(0),
        mtu: rdma_types::Mtu::Mtu1024,
        initiator_depth: 16,
        ack_timeout: 14,
        local_psn: None,
    };
    let valid = valid_login(ROGUE, 0x500);
    let mut bad_logins: Vec<(&str, Vec<u8>)> = vec![
        ("empty", Vec::new()),
        ("5 bytes", vec![0; 5]),
        ("all ones", vec![0xff; 56]),
        ("truncated", login_bytes(&valid)[..30].to_vec()),
    ];
    for (what, len) in [("IU length 0", 0u32), ("IU length 16", 16)] {
        let mut l = valid;
        l.req_it_iu_len = len;
        bad_logins.push((what, login_bytes(&l)));
    }
    let mut l = valid;
    l.target_port_id = srp::wire::PortId([0x42; 16]);
    bad_logins.push(("another target's port", login_bytes(&l)));
    for (what, bytes) in &bad_logins {
        match rig.port.login(bytes, TargetForm::RdmaCm, peer) {
            LoginOutcome::Rejected { reason, .. } => println!("login {what}: rejected: {reason}"),
            LoginOutcome::Accepted { .. } => panic!("login {what} accepted"),
        }
    }
    // An IU length far above what the target takes: refused or lowered.
    let mut l = valid;
    l.req_it_iu_len = u32::MAX;
    match rig.port.login(&login_bytes(&l), TargetForm::RdmaCm, peer) {
        LoginOutcome::Rejected { reason, .. } => println!("login IU length 2^32-1: {reason}"),
        LoginOutcome::Accepted { conn, rsp, .. } => {
            let rsp = srp::wire::LoginRsp::parse(&rsp).unwrap();
            assert!(rsp.max_it_iu_len <= 64 << 10, "{rsp:?}");
            rig.port.disconnected(conn);
        }
    }

    // Malformed IUs on a logged-in channel, one fresh login each (most end
    // the channel).
    let bogus = |len: u32| DirectBuf {
        va: 0x1000,
        key: rdma_types::Rkey(0xdead_beef),
        len,
    };
    let write10 = {
        let mut c = [0u8; 10];
        c[0] = 0x2a;
        c[2..6].copy_from_slice(&(fence_lba as u32).to_be_bytes());
        c[8] = 1;
        c
    };
    let read10 = {
        let mut c = write10;
        c[0] = 0x28;
        c
    };
    // 128 KiB: two data-in WRITEs of srp_max_rdma_size out of the RAM
    // store, unsignaled and joined into one.
    let read10_128k = {
        let mut c = read10;
        c[2..6].fill(0);
        c[7..9].copy_from_slice(&((128u32 << 10) / 512).to_be_bytes()[2..]);
        c
    };
    let tur = cmd_iu(7, &[0; 6], DataDesc::None, DataDesc::None);
    let mut add_cdb = tur.clone();
    add_cdb[31] = 0xfc; // 252 more CDB bytes than the IU holds
    add_cdb.resize(64, 0);
    let mut indirect = tur.clone();
    indirect[5] = 0x20; // data-out indirect ...
    indirect[6] = 255; // ... with 255 descriptors in a 68-byte IU
    indirect.resize(68, 0);
    let mut fmt = tur.clone();
    fmt[5] = 0xf0; // data-out format 0xf
    let cred_rsp = {
        let mut b = vec![0u8; 16];
        b[0] = 0x41; // SRP_CRED_RSP nobody asked for
        b[8] = 9;
        b
    };
    let attacks: Vec<(&str, Vec<u8>, Expect)> = vec![
        (
            "unknown IU type 0x55",
            vec![0x55; 64],
            Expect::Logout(Some(TLogoutReason::InvalidIuType)),
        ),
        (
            "SRP_LOGIN_REQ on the channel",
            {
                let mut b = vec![0u8; 64];
                valid.emit(&mut b).unwrap();
                assert_eq!(b[0], 0x00, "SRP_LOGIN_REQ opcode");
                b
            },
            Expect::Logout(Some(TLogoutReason::InvalidIuType)),
        ),
        ("empty IU", Vec::new(), Expect::Logout(None)),
        (
            "truncated SRP_CMD",
            tur[..20].to_vec(),
            Expect::Logout(Some(TLogoutReason::InvalidIuLength)),
        ),
        (
            "truncated SRP_TSK_MGMT",
            tmf_iu(8, TmFunc::AbortTaskSet)[..12].to_vec(),
            Expect::Logout(Some(TLogoutReason::InvalidIuLength)),
        ),
        (
            "IU above the negotiated length",
            Vec::new(),
            Expect::Logout(None),
        ),
        ("64 KiB IU", vec![0x02; 64 << 10], Expect::Logout(None)),
        (
            "spurious SRP_CRED_RSP",
            cred_rsp,
            Expect::Logout(Some(TLogoutReason::SpuriousResponse)),
        ),
        (
            "unknown data-out format",
            fmt,
            Expect::Logout(Some(TLogoutReason::UnsupportedDataOutFormat)),
        ),
        ("additional CDB past the IU", add_cdb, Expect::Refused(7)),
        (
            "255 descriptors in a short IU",
            indirect,
            Expect::Refused(7),
        ),
        (
            "WRITE(10) of one block, data-out 4 GiB at a bogus R_Key",
            cmd_iu(
                9,
                &write10,
                DataDesc::Direct(bogus(0xffff_fff0)),
                DataDesc::None,
            ),
            Expect::Refused(9),
        ),
        (
            "READ(10) of one block, data-in 4 GiB at a bogus R_Key",
            cmd_iu(
                10,
                &read10,
                DataDesc::None,
                DataDesc::Direct(bogus(0xffff_ffff)),
            ),
            Expect::Refused(10),
        ),
    ];
    let rounds = if long() { 25 } else { 1 };
    for round in 0..rounds {
        for (i, (what, iu, want)) in attacks.iter().enumerate() {
            let mut raw = Raw::login(&rig, ROGUE, 0x1000 + 0x20 * round + i as u64);
            let mut iu = iu.clone();
            if *what == "IU above the negotiated length" {
                iu = tur.clone();
                iu.resize(raw.max_it_iu_len as usize + 512, 0);
            }
            raw.send(&iu);
            let got = raw.answer();
            let said = judge(what, &got, *want);
            if round == 0 {
                println!("{what}: {said}");
            }
        }
    }

    // An unknown task management function is refused; the channel stays.
    let mut raw = Raw::login(&rig, ROGUE, 0x700);
    raw.send(&tmf_iu(11, TmFunc::Unknown(0x77)));
    match raw.answer() {
        Reaction::Iu(b) => match Iu::parse(&b, None).unwrap() {
            Iu::Rsp(r) => {
                assert_eq!(r.tag, Tag(11));
                let code = r.response_data.expect("RSPVALID")[3];
                assert_eq!(RspCode::from(code), RspCode::NotSupported);
            }
            other => panic!("TMF 0x77: {other:?}"),
        },
        other => panic!("TMF 0x77: {other:?}"),
    }
    raw.send(&cmd_iu(12, &[0; 6], DataDesc::None, DataDesc::None));
    match raw.answer() {
        Reaction::Iu(b) => match Iu::parse(&b, None).unwrap() {
            Iu::Rsp(r) => assert_eq!(r.tag, Tag(12)),
            other => panic!("TEST UNIT READY after TMF 0x77: {other:?}"),
        },
        other => panic!("TEST UNIT READY after TMF 0x77: {other:?}"),
    }

    // Auto contingent allegiance through SRP: a command that fails with
    // NACA=1 in its CONTROL byte holds the nexus's next command (ACA
    // ACTIVE) until CLEAR ACA, which the target carries to the SCSI core.
    let verify_past_end = [0x2f, 0, 0xff, 0xff, 0xff, 0x00, 0, 0, 1, 0x04];
    raw.send(&cmd_iu(
        13,
        &verify_past_end,
        DataDesc::None,
        DataDesc::None,
    ));
    assert_eq!(rsp(&mut raw, 13).0, 0x02, "CHECK CONDITION");
    raw.send(&cmd_iu(14, &[0; 6], DataDesc::None, DataDesc::None));
    assert_eq!(rsp(&mut raw, 14).0, 0x30, "ACA ACTIVE");
    raw.send(&tmf_iu(15, TmFunc::ClearAca));
    assert_eq!(rsp(&mut raw, 15).1, Some(RspCode::Complete), "CLEAR ACA");
    raw.send(&cmd_iu(16, &[0; 6], DataDesc::None, DataDesc::None));
    assert_eq!(rsp(&mut raw, 16).0, 0x00, "GOOD after CLEAR ACA");
    drop(raw);

    // A READ from LUN 1 (the memory store) whose data-in WRITEs fail at
    // the rogue's NIC (a bogus R_Key, after a TEST UNIT READY has taken
    // the login's unit attention): the two WRITEs are joined into one, so
    // the first has no completion of its own, and the channel must still
    // be released (checked below, with the others).
    let mut raw = Raw::login(&rig, ROGUE, 0x780);
    raw.send(&cmd_iu_at(1, 17, &[0; 6], DataDesc::None, DataDesc::None));
    let _ = raw.answer();
    raw.send(&cmd_iu_at(
        1,
        18,
        &read10_128k,
        DataDesc::None,
        DataDesc::Direct(bogus(128 << 10)),
    ));
    let what = "READ(10) of 128 KiB at a bogus R_Key";
    println!(
        "{what}: {}",
        judge(what, &raw.answer(), Expect::Logout(None))
    );
    drop(raw);

    stop.store(true, Ordering::SeqCst);
    let reports = load.join().unwrap();
    let verified = check_reports("good initiator", &reports);
    assert!(!good.is_closed());
    let st = good.stats();
    assert_eq!((st.timeouts, st.protocol_errors), (0, 0), "{st:?}");
    // None of the rogue's writes landed.
    let mut back = vec![0u8; fence.len()];
    dev.read_at(fence_lba, &mut back).unwrap();
    assert!(back == fence, "the rogue changed blocks it had no right to");

    // The target still serves a new initiator, and released every rogue
    // channel and RDMA chunk.
    let third = rig.session(THIRD, 3);
    let disk = Disk::open(third.clone(), 0).unwrap();
    let data = pattern(MIB as usize, 3);
    disk.write(10 * MIB / 512, &data).unwrap();
    let mut back = vec![0u8; data.len()];
    disk.read(10 * MIB / 512, &mut back).unwrap();
    assert!(back == data);
    wait_until(10, "rogue channels released", || {
        rig.port.sessions().len() == 2
    });
    wait_until(10, "RDMA chunks back", || {
        rig.port.free_chunks() == PortOptions::default().chunks
    });
    rig.p.close_ca(keeper).unwrap();
    println!(
        "good initiator: {} runs, {verified} bytes verified, retries {r:?}",
        reports.len()
    );
}

#[test]
fn lun_reset_from_another_initiator_during_verified_io() {
    let rig = rig(93, 16 * MIB, &[]);
    // A command the reset aborts gets no response (the target's TAS = 0,
    // SAM-5 5.6): the initiator learns of it by its timeout and error
    // handler, so a short timeout keeps the test short.
    let mut c = chan(GOOD, 1);
    c.cmd_timeout = rdma_types::Duration::from_secs(2);
    let good = rig.session_with(GOOD, c);
    let r = Arc::new(Retries::default());
    let dev = retrying(&good, &r);
    let size = if long() { 512 * MIB } else { 64 * MIB };
    let w = randrw(8 * MIB, size, 16 << 10, 4, 0x4e5e);
    let run = {
        let dev = dev.clone();
        std::thread::spawn(move || blockload::run(dev, &w, |_| {}).unwrap())
    };
    let mut raw = Raw::login(&rig, ROGUE, 0x800);
    let want = if long() { 40 } else { 10 };
    let mut resets = 0u64;
    while resets < want && !run.is_finished() {
        // Each reset after more commands completed, so it lands in the
        // middle of the workload.
        let done = good.stats().completed;
        while good.stats().completed < done + 100 && !run.is_finished() {
            std::thread::yield_now();
        }
        if run.is_finished() {
            break;
        }
        let tag = 0x100 + resets;
        raw.send(&tmf_iu(tag, TmFunc::LogicalUnitReset));
        match raw.answer() {
            Reaction::Iu(b) => match Iu::parse(&b, None).unwrap() {
                Iu::Rsp(rsp) => {
                    assert_eq!(rsp.tag, Tag(tag));
                    let code = rsp.response_data.expect("RSPVALID")[3];
                    assert_eq!(RspCode::from(code), RspCode::Complete);
                }
                other => panic!("LU reset: {other:?}"),
            },
            other => panic!("LU reset: {other:?}"),
        }
        resets += 1;
    }
    let rep = run.join().unwrap();
    println!("{}\nresets {resets}, retries {r:?}", rep.table());
    assert_eq!(rep.verify_failures, 0, "{}", rep.table());
    assert_eq!(rep.io_errors, 0, "{}", rep.table());
    assert!(rep.verified_bytes >= MIB, "{}", rep.table());
    assert!(
        resets >= 2,
        "only {resets} resets landed during the workload"
    );
    // SAM-5 7.7: the other nexus is told of each reset it has not yet seen.
    assert!(r.ua_reset.load(Ordering::Relaxed) >= 1, "{r:?}");
    assert!(!good.is_closed());
}

/// REPORT LUNS through LUN 0, single-level LUN numbers.
fn report_luns(s: &Session, r: &Retries) -> Vec<u64> {
    let cdb = [0xa0, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0];
    let res = exec(s, lun(0), &cdb, Xfer::In(1024), r).unwrap();
    let n = u32::from_be_bytes(res.data[0..4].try_into().unwrap()) as usize / 8;
    (0..n)
        .map(|i| {
            let e = &res.data[8 + 8 * i..16 + 8 * i];
            u64::from(u16::from_be_bytes([e[0], e[1]]) & 0x3fff)
        })
        .collect()
}

#[test]
fn lun_1_added_and_removed_under_verified_io() {
    let rig = rig(94, 16 * MIB, &[]);
    let good = rig.session(GOOD, 1);
    let r = Arc::new(Retries::default());
    let dev = retrying(&good, &r);
    let stop = Arc::new(AtomicBool::new(false));
    let load = load_until(
        dev.clone(),
        randrw(2 * MIB, 4 * MIB, 16 << 10, 2, 0x1a1),
        stop.clone(),
    );
    let side = Retries::default();
    let cycles = if long() { 300 } else { 50 };
    let aers = good.stats().aers;
    for c in 0..cycles {
        let serial = format!("rel-lun1-{c}");
        rig.scsi
            .add_lun(None, scsi::Lun::new(1).unwrap(), ram_device(MIB, &serial));
        assert!(rig.port.notify(AerEvent::LunsChanged) >= 1);
        assert_eq!(report_luns(&good, &side), [0, 1], "cycle {c}");
        // LUN 1 holds what was written to it.
        let data = pattern(64 << 10, c);
        exec(&good, lun(1), &rw16(0x8a, 7, 128), Xfer::Out(&data), &side).unwrap();
        let back = exec(
            &good,
            lun(1),
            &rw16(0x88, 7, 128),
            Xfer::In(64 << 10),
            &side,
        )
        .unwrap()
        .data;
        assert!(back == data, "cycle {c}: LUN 1 read back differs");

        assert!(rig
            .scsi
            .remove_lun(None, scsi::Lun::new(1).unwrap())
            .is_some());
        assert!(rig.port.notify(AerEvent::LunsChanged) >= 1);
        assert_eq!(report_luns(&good, &side), [0], "cycle {c}");
        let gone = good.execute(lun(1), &[0; 6], Xfer::None).unwrap();
        assert_eq!(sense_triple(&gone.sense), (0x5, 0x25, 0x00), "cycle {c}");
    }
    stop.store(true, Ordering::SeqCst);
    let reports = load.join().unwrap();
    let verified = check_reports("LUN 0", &reports);
    wait_until(10, "every SRP_AER_REQ", || {
        good.stats().aers >= aers + 2 * cycles
    });
    println!(
        "{cycles} add/remove cycles, {} runs on LUN 0, {verified} bytes verified, \
         LUN 0 retries {r:?}, side retries {side:?}, AERs {}",
        reports.len(),
        good.stats().aers - aers
    );
    assert!(!good.is_closed());
}

/// `srptd` in its own process gets absurd logins through RDMA CM (wrong
/// sizes, garbage, wrong target), refuses each with a REJ, and then serves
/// a verified `srp io` from another process.
#[test]
fn srptd_refuses_absurd_cm_logins_then_serves_verified_io() {
    let sock = std::env::temp_dir().join(format!("srptd-rel-{}.sock", std::process::id()));
    let d = common::Proc::start(
        "srptd",
        common::tool(common::srptd_bin())
            .args([
                "--ip",
                "127.0.92.101",
                "--ram-mib",
                "16",
                "--control-socket",
            ])
            .arg(&sock),
    );
    d.wait_line("listening on", 20);
    let ip: std::net::IpAddr = "127.0.92.102".parse().unwrap();
    let guid = Guid(0x0002_c903_00b0_0992);
    let p = SoftRoce::new(vec![SoftCa { guid, ip }], ROCE_PORT);
    let agent = rdma_access::CmAgent::start(p.clone(), guid, 0x9200).unwrap();
    let cm = srp_initiator::connectors::RdmaCmConnector {
        agent,
        src: ip,
        dst: "127.0.92.101:5555".parse().unwrap(),
        timeout: Duration::from_secs(5),
    };
    let me = srp_initiator::session::QpInfo {
        qpn: rdma_types::Qpn::from_bits(0x123),
        psn: Psn::new(0x42),
        gid: rdma_types::Gid::from_ip(ip),
        lid: Lid(0),
        mtu: rdma_types::Mtu::Mtu1024,
    };
    // A login for another target port (srptd's ID is not known here); the
    // CM pads the private data, so short ones arrive zero-filled.
    let valid = {
        let mut c = ChannelConfig::new(0x92, guid, 0x1, Guid(0x2));
        c.can_queue = 16;
        srp::initiator::Channel::new(c)
            .unwrap()
            .login_request()
            .unwrap()
    };
    let mut logins: Vec<(&str, Vec<u8>)> = vec![
        ("empty", Vec::new()),
        ("one byte", vec![0]),
        ("all ones", vec![0xff; 56]),
        ("truncated", login_bytes(&valid)[..24].to_vec()),
        ("another target's port", login_bytes(&valid)),
    ];
    for len in [0u32, 1, u32::MAX] {
        let mut l = valid;
        l.req_it_iu_len = len;
        logins.push(("absurd IU length", login_bytes(&l)));
    }
    for (what, bytes) in &logins {
        use srp_initiator::session::{ConnectError, Connector};
        match cm.connect(bytes, me) {
            Err(ConnectError::Rejected(rej)) => {
                let parsed = srp::wire::LoginRej::parse(&rej);
                println!("{what}: REJ {parsed:?}");
                assert!(parsed.is_ok(), "{what}: REJ without an SRP_LOGIN_REJ");
            }
            Err(e) => panic!("{what}: {e}"),
            Ok(c) => panic!("{what}: accepted {c:?}"),
        }
    }
    drop(cm);
    // Still up, and serving: verified I/O from another process.
    let out = common::tool(common::srp_bin())
        .args(["io", "--dest", "127.0.92.101:5555", "--ip", "127.0.92.103"])
        .args(["--size", "8388608", "--region", "2097152", "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["verify_failures"], 0, "{r}");
    assert_eq!(r["io_errors"], 0, "{r}");
    assert!(r["verified_bytes"].as_u64().unwrap() > 0, "{r}");
    drop(d);
    let _ = std::fs::remove_file(&sock);
}

fn srptd_on(ip: &str, sock: &std::path::Path) -> common::Proc {
    let d = common::Proc::start(
        "srptd",
        common::tool(common::srptd_bin())
            .args(["--ip", ip, "--ram-mib", "16", "--control-socket"])
            .arg(sock),
    );
    d.wait_line("listening on", 20);
    d
}

/// Commands the target has accepted from all its sessions (`srptadm`).
fn target_commands(sock: &std::path::Path) -> u64 {
    let out = std::process::Command::new(common::srptadm_bin())
        .arg("--socket")
        .arg(sock)
        .args(["--json", "sessions"])
        .output()
        .unwrap();
    if !out.status.success() {
        return 0;
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    v.as_array()
        .map(|a| a.iter().filter_map(|s| s["commands"].as_u64()).sum())
        .unwrap_or(0)
}

/// `srptd` killed (SIGKILL) under verified I/O: the initiator's workload
/// ends with I/O errors in bounded time, no command reported GOOD with
/// wrong data; a restarted `srptd` on the same address serves a verified
/// `srp io`. (The session does not reconnect by itself; a new login is
/// needed.)
#[test]
fn srptd_killed_under_io_initiator_fails_cleanly_and_restart_serves() {
    let sock = std::env::temp_dir().join(format!("srptd-kill-{}.sock", std::process::id()));
    let mut d = srptd_on("127.0.93.101", &sock);
    let io = |ip: &str, size: &str| {
        common::tool(common::srp_bin())
            .args(["io", "--dest", "127.0.93.101:5555", "--ip", ip])
            .args(["--size", size, "--region", "2097152", "--json"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    // The victim logs in from this process by RDMA CM, with a short
    // command timeout: a dead target is noticed either by the RC transport
    // (retries exhausted on an unacknowledged packet) or, when every packet
    // was acknowledged and only SRP responses are awaited, by the timeout.
    let guid = Guid(0x0002_c903_00b0_0993);
    let ip: std::net::IpAddr = "127.0.93.102".parse().unwrap();
    let p = SoftRoce::new(vec![SoftCa { guid, ip }], ROCE_PORT);
    let agent = rdma_access::CmAgent::start(p.clone(), guid, 0x9300).unwrap();
    let cm = Arc::new(srp_initiator::connectors::RdmaCmConnector {
        agent,
        src: ip,
        dst: "127.0.93.101:5555".parse().unwrap(),
        timeout: Duration::from_secs(10),
    });
    let mut c = ChannelConfig::new(
        0x93,
        guid,
        rnic::softroce::ip_guid("127.0.93.101".parse().unwrap()).0,
        rnic::softroce::ip_guid("127.0.93.101".parse().unwrap()),
    );
    c.cmd_timeout = rdma_types::Duration::from_secs(3);
    let victim = Arc::new(Session::connect(p.clone(), guid, cm, SessionConfig::new(c)).unwrap());
    let disk: Arc<dyn BlockDevice> = Arc::new(Disk::open(victim.clone(), 0).unwrap());
    // Far more than it can move before the kill.
    let w = randrw(2 * MIB, 64 << 30, 16 << 10, 4, 0x9393);
    let run = std::thread::spawn(move || blockload::run(disk, &w, |_| {}).unwrap());
    wait_until(30, "I/O under way", || target_commands(&sock) > 300);
    d.child.kill().unwrap();
    d.child.wait().unwrap();
    let killed = Instant::now();
    wait_until(60, "the workload to end after the target died", || {
        run.is_finished()
    });
    let r = run.join().unwrap();
    println!(
        "after SIGKILL, the workload ended {:?} later: {:?}; session {:?}",
        killed.elapsed(),
        r.first_io_error,
        victim.stats()
    );
    assert!(r.io_errors > 0, "{}", r.table());
    assert_eq!(r.verify_failures, 0, "{}", r.table());
    assert!(r.verified_bytes > 0, "{}", r.table());
    assert!(victim.is_closed());
    drop(d);
    let _ = std::fs::remove_file(&sock);

    let _d = srptd_on("127.0.93.101", &sock);
    let t = Instant::now();
    let out = io("127.0.93.103", "8388608").wait_with_output().unwrap();
    println!("srp io against the restarted srptd: {:?}", t.elapsed());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["verify_failures"], 0, "{r}");
    assert_eq!(r["io_errors"], 0, "{r}");
    assert!(r["verified_bytes"].as_u64().unwrap() > 0, "{r}");
    let _ = std::fs::remove_file(&sock);
}
