//! `register_always`: each command's pages behind a memory window of their
//! own. Verified I/O through every descriptor form with it (loopback and
//! soft RoCE), and a rogue target that, handed a command's descriptor,
//! writes past it: with the pool's R_Key the write lands in the pool (what
//! the option is for), with the command's window it is refused with a
//! remote access error, the session ends with the command failed rather
//! than hanging, and a new login serves verified I/O.

mod common;

use common::{connect, fabric, ram, soft_pair, target_port};
use rdma_types::{AccessFlags, Guid, Mtu, PortNum, Psn, QpState, QpType, WcStatus};
use srp::initiator::ChannelConfig;
use srp::wire::{
    BufFormats, Cmd, DataDesc, LoginReq, LoginRsp, LoginRspFlags, MultiChannelResult, Tag, TaskAttr,
};
use srp_initiator::disk::Disk;
use srp_initiator::session::{
    ConnectError, Connected, Connector, QpInfo, Session, SessionConfig, SessionError, Xfer,
};
use srp_target::{PortOptions, TargetPort};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use verbs::conformance::{Feature, Fixture, Node};
use verbs::{AhAttr, Provider, QpAttr, QpHandle, RecvWr, SendOpcode, SendWr};

const TARGET_GUID: u64 = 0x0002_c903_0000_3333;
const INIT_GUID: u64 = 0x0002_c903_0000_4444;

fn chan() -> ChannelConfig {
    ChannelConfig::new(0x22, Guid(INIT_GUID), TARGET_GUID, Guid(TARGET_GUID))
}

fn real_target(p: &Arc<dyn Provider>) -> Arc<TargetPort> {
    target_port(
        p,
        TARGET_GUID,
        chan().target_port_id(),
        "register-always",
        vec![ram(16 << 20)],
        PortOptions::default(),
    )
}

/// 1 MiB written and read back through `sess` at `lba`.
fn verified(sess: &Arc<Session>, lba: u64, seed: u8) {
    let disk = Disk::open(sess.clone(), 0).unwrap();
    for len in [512usize, 4096, 1 << 20] {
        let data: Vec<u8> = (0..len).map(|i| (i as u8) ^ seed).collect();
        disk.write(lba, &data).unwrap();
        let mut back = vec![0u8; len];
        disk.read(lba, &mut back).unwrap();
        assert!(back == data, "{len} bytes at {lba}");
    }
}

#[test]
fn verified_io_through_every_descriptor_form_with_a_window_per_command() {
    let loopback: Arc<dyn Provider> = fabric(&[TARGET_GUID, INIT_GUID]);
    let soft: Arc<dyn Provider> = soft_pair(TARGET_GUID, INIT_GUID, 61, rnic::softroce::ROCE_PORT);
    for p in [loopback, soft] {
        let port = real_target(&p);
        // (cmd_sg_entries, segment, external tables): one descriptor,
        // several in the IU, a table the target fetches by RDMA READ.
        for (sg, seg, ext) in [(1u8, 0u32, false), (255, 4096, false), (1, 4096, true)] {
            let mut c = chan();
            c.cmd_sg_entries = sg;
            c.allow_ext_sg = ext;
            let mut cfg = SessionConfig::new(c);
            cfg.max_segment = seg;
            cfg.register_always = true;
            let sess = connect(&p, INIT_GUID, &port, cfg);
            verified(&sess, 2048, sg ^ seg as u8);
            assert_eq!(sess.stats().aborted, 0);
        }
    }
}

/// The loopback fabric, for [`Node::open`].
struct On(Arc<dyn Provider>);

impl Fixture for On {
    fn provider(&self) -> Arc<dyn Provider> {
        self.0.clone()
    }
    fn guids(&self) -> (Guid, Guid) {
        (Guid(TARGET_GUID), Guid(INIT_GUID))
    }
    fn set_port_active(&self, _: Guid, _: bool) -> verbs::Result<()> {
        Err(verbs::VerbsError::NotSupported("set_port_active"))
    }
    fn set_lid(&self, _: Guid, _: rdma_types::Lid) -> verbs::Result<()> {
        Err(verbs::VerbsError::NotSupported("set_lid"))
    }
    fn remove_ca(&self, _: Guid) -> verbs::Result<()> {
        Err(verbs::VerbsError::NotSupported("remove_ca"))
    }
    fn lacks(&self) -> Vec<Feature> {
        Vec::new()
    }
}

/// A target that accepts any login and then does what the test says: its
/// QP on the target CA, receive buffers at the start of its node's
/// buffer.
struct Rogue {
    node: Node,
    qp: QpHandle,
    connected: Mutex<bool>,
}

const IU: u32 = 1024;

impl Rogue {
    fn new(p: &Arc<dyn Provider>) -> Rogue {
        let node = Node::open(&On(p.clone()), Guid(TARGET_GUID), 64);
        let qp = node.qp(QpType::Rc, None, 7);
        Rogue {
            node,
            qp,
            connected: Mutex::new(false),
        }
    }

    /// The next IU the initiator sent (within 10 s).
    fn next_iu(&self) -> Vec<u8> {
        let wc = self.node.wc();
        assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
        self.node
            .buf
            .to_vec((wc.wr_id as u32 * IU) as usize, wc.byte_len as usize)
    }

    /// An RDMA WRITE of `len` bytes to `va` with `rkey`; its status.
    fn write(&self, va: u64, rkey: rdma_types::Rkey, len: u32) -> WcStatus {
        let mut wr = SendWr::new(
            99,
            SendOpcode::RdmaWrite,
            vec![self.node.sge(32 << 10, len)],
        );
        wr.remote = verbs::RemoteAddr { addr: va, rkey };
        self.node.p.post_send(self.qp, &[wr]).unwrap();
        self.node.wc().status
    }
}

impl Connector for Rogue {
    fn connect(&self, login: &[u8], local: QpInfo) -> Result<Connected, ConnectError> {
        let req = LoginReq::parse_rdma(login).expect("a login request");
        let (n, qp) = (&self.node, self.qp);
        let step = |a: QpAttr| n.p.modify_qp(qp, &a).unwrap();
        step(QpAttr {
            state: Some(QpState::Init),
            pkey_index: Some(0),
            port: Some(PortNum(1)),
            access: Some(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ),
            ..Default::default()
        });
        for i in 0..8u32 {
            n.p.post_recv(
                qp,
                &[RecvWr {
                    wr_id: i as u64,
                    sges: verbs::sges![n.sge((i * IU) as u64, IU)],
                }],
            )
            .unwrap();
        }
        step(QpAttr {
            state: Some(QpState::Rtr),
            av: Some(AhAttr {
                dlid: local.lid,
                port: PortNum(1),
                grh: true,
                dgid: local.gid,
                sgid_index: 0,
                sl: 0,
                hop_limit: 64,
            }),
            path_mtu: Some(local.mtu),
            dest_qpn: Some(local.qpn),
            rq_psn: Some(Psn::new(0)),
            max_dest_rd_atomic: Some(4),
            min_rnr_timer: Some(1),
            ..Default::default()
        });
        step(QpAttr {
            state: Some(QpState::Rts),
            sq_psn: Some(local.psn),
            timeout: Some(14),
            retry_cnt: Some(7),
            rnr_retry: Some(7),
            max_rd_atomic: Some(4),
            ..Default::default()
        });
        let rsp = LoginRsp {
            req_lim_delta: 8,
            tag: req.tag,
            max_it_iu_len: req.req_it_iu_len.min(IU),
            max_ti_iu_len: 256,
            buf_fmt: BufFormats(BufFormats::DIRECT.0 | BufFormats::INDIRECT.0),
            flags: LoginRspFlags::new(MultiChannelResult::NoExisting, false),
        };
        let mut private_data = vec![0; rsp.buffer_len()];
        rsp.emit(&mut private_data).unwrap();
        *self.connected.lock().unwrap() = true;
        Ok(Connected {
            peer: QpInfo {
                qpn: n.p.qp_num(qp).unwrap(),
                psn: Psn::new(0),
                gid: n.port.gids[0],
                lid: n.port.lid,
                mtu: Mtu::Mtu1024.min(local.mtu),
            },
            private_data,
            handle: 1,
            local_psn: None,
        })
    }
    fn disconnect(&self, _: u64) {}
}

/// A READ of 8 KiB is started; the rogue takes its descriptor, writes
/// inside it, then just past it. Returns the session, the started
/// command and the status of the write past the buffer.
fn rogue_read(register_always: bool) -> (Arc<Session>, srp_initiator::session::Started, WcStatus) {
    let p: Arc<dyn Provider> = fabric(&[TARGET_GUID, INIT_GUID]);
    let rogue = Arc::new(Rogue::new(&p));
    let mut cfg = SessionConfig::new(chan());
    cfg.register_always = register_always;
    cfg.probe_interval = None;
    let sess = Arc::new(Session::connect(p, Guid(INIT_GUID), rogue.clone(), cfg).unwrap());
    // READ(10) of 16 blocks of 512 bytes.
    let cdb = [0x28, 0, 0, 0, 0, 0, 0, 0, 16, 0];
    let started = sess
        .start(
            srp::wire::Lun::from_u64(0),
            &cdb,
            &Xfer::In(8192),
            TaskAttr::Simple,
        )
        .unwrap();
    let iu = rogue.next_iu();
    let cmd = Cmd::parse(&iu, None).expect("an SRP_CMD");
    let DataDesc::Direct(d) = cmd.data_in else {
        panic!("one direct descriptor: {:?}", cmd.data_in)
    };
    assert_eq!(d.len, 8192);
    assert_eq!(rogue.write(d.va, d.key, d.len), WcStatus::Success, "inside");
    let past = rogue.write(d.va + u64::from(d.len), d.key, 4096);
    let _: Tag = cmd.tag;
    (sess, started, past)
}

#[test]
fn a_target_writing_past_a_command_is_refused_only_with_register_always() {
    // The pool's R_Key reaches past the command: the write lands.
    let (sess, started, past) = rogue_read(false);
    assert_eq!(past, WcStatus::Success, "the pool key reaches other pages");
    drop(started);
    drop(sess);

    // The command's window does not.
    let (sess, started, past) = rogue_read(true);
    assert_eq!(past, WcStatus::RemAccessErr);
    // The initiator's QP failed under the violation: the command ends in
    // error, promptly, not after its timeout.
    let t = Instant::now();
    let r = sess.finish(started, Xfer::In(8192));
    assert!(!r.good(), "{r:?}");
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    assert!(sess.is_closed());
    match sess.execute(srp::wire::Lun::from_u64(0), &[0; 6], Xfer::None) {
        Err(SessionError::Closed) => {}
        other => panic!("{other:?}"),
    }
}

#[test]
fn after_a_refused_write_a_new_login_serves_verified_io() {
    let (sess, started, past) = rogue_read(true);
    assert_eq!(past, WcStatus::RemAccessErr);
    let _ = sess.finish(started, Xfer::In(8192));
    // A real target on another fabric: the initiator's side is whole.
    let p: Arc<dyn Provider> = fabric(&[TARGET_GUID, INIT_GUID]);
    let port = real_target(&p);
    let mut cfg = SessionConfig::new(chan());
    cfg.register_always = true;
    let again = connect(&p, INIT_GUID, &port, cfg);
    verified(&again, 0, 0x5a);
}
