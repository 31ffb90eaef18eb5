//! What the initiator's tests share: the in-process connector they log in
//! with, the fabrics and target ports they log in to, and a gate that
//! holds a store's or a connector's calls while a test looks.

#![allow(dead_code)]

use rdma_types::Guid;
use rnic::loopback::{CaConfig, Fabric};
use rnic::softroce::{SoftCa, SoftRoce};
use srp::target::{LoginForm as TargetForm, TargetConfig};
use srp::wire::PortId;
use srp_initiator::session::{
    ConnectError, Connected, Connector, LoginForm, QpInfo, Session, SessionConfig,
};
use srp_target::{LoginOutcome, PeerQp, PortOptions, TargetPort};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Logs in by calling the target port's login entry point directly, the
/// way a CM would with the REQ's private data.
pub struct Direct {
    pub port: Arc<TargetPort>,
    /// The LID the target port answers with (0 on RoCE).
    pub lid: rdma_types::Lid,
    /// Called after each disconnect reached the target (a test's gate).
    pub on_disconnect: Option<Arc<dyn Fn() + Send + Sync>>,
}

impl Connector for Direct {
    fn connect(&self, login: &[u8], local: QpInfo) -> Result<Connected, ConnectError> {
        let peer = PeerQp {
            qpn: local.qpn,
            psn: local.psn,
            gid: local.gid,
            lid: local.lid,
            mtu: local.mtu,
            initiator_depth: 16,
            ack_timeout: 14,
            local_psn: None,
        };
        match self.port.login(login, TargetForm::RdmaCm, peer) {
            LoginOutcome::Accepted {
                conn,
                local: t,
                rsp,
            } => Ok({
                // No CM here: the connection is up as the login returns.
                self.port.established(conn);
                Connected {
                    peer: QpInfo {
                        qpn: t.qpn,
                        psn: t.psn,
                        gid: self.port.gid(),
                        lid: self.lid,
                        mtu: local.mtu,
                    },
                    private_data: rsp,
                    handle: conn.0,
                    local_psn: None,
                }
            }),
            LoginOutcome::Rejected { rej, .. } => Err(ConnectError::Rejected(rej)),
        }
    }
    fn disconnect(&self, handle: u64) {
        self.port.disconnected(srp_target::ConnId(handle));
        if let Some(f) = &self.on_disconnect {
            f();
        }
    }
    fn form(&self) -> LoginForm {
        LoginForm::RdmaCm
    }
}

/// A loopback fabric with one CA per GUID, at LIDs 1, 2, ... in order.
pub fn fabric(guids: &[u64]) -> Arc<Fabric> {
    let fabric = Fabric::new();
    for (lid, &guid) in (1..).zip(guids) {
        fabric.add_ca(CaConfig::simple(guid, lid)).unwrap();
    }
    fabric
}

/// Two soft RoCE NICs on a test's own loopback addresses: the target's
/// on 127.0.`net`.1, the initiator's on .2, both on UDP `port`.
pub fn soft_pair(target: u64, initiator: u64, net: u8, port: u16) -> Arc<SoftRoce> {
    let ip = |h: u8| std::net::IpAddr::V4(std::net::Ipv4Addr::new(127, 0, net, h));
    SoftRoce::new(
        vec![
            SoftCa {
                guid: Guid(target),
                ip: ip(1),
            },
            SoftCa {
                guid: Guid(initiator),
                ip: ip(2),
            },
        ],
        port,
    )
}

/// A device over `bytes` of RAM, configured by default.
pub fn ram(bytes: u64) -> scsi::Device {
    scsi::Device::new(
        scsi::DeviceConfig::default(),
        Arc::new(scsi::Ram::new(bytes)),
    )
    .unwrap()
}

/// The target port `name` on `provider`'s CA `guid`, answering as `id`,
/// with `luns` as LUN 0, 1, ...
pub fn target_port(
    provider: &Arc<dyn verbs::Provider>,
    guid: u64,
    id: PortId,
    name: &str,
    luns: Vec<scsi::Device>,
    opts: PortOptions,
) -> Arc<TargetPort> {
    let scsi = Arc::new(scsi::Target::new());
    for (n, dev) in (0..).zip(luns) {
        scsi.add_lun(None, scsi::Lun::new(n).unwrap(), Arc::new(dev));
    }
    Arc::new(
        TargetPort::start(
            provider.clone(),
            Guid(guid),
            TargetConfig::new(id, name),
            scsi,
            opts,
        )
        .unwrap(),
    )
}

/// A session from `provider`'s CA `initiator` to `port` through
/// [`Direct`]; the target answers with LID 0 on soft RoCE and 1 on a
/// [`fabric`] (its CA first).
pub fn connect(
    provider: &Arc<dyn verbs::Provider>,
    initiator: u64,
    port: &Arc<TargetPort>,
    cfg: SessionConfig,
) -> Arc<Session> {
    let soft = provider.name() == "softroce";
    let direct = Arc::new(Direct {
        port: port.clone(),
        lid: rdma_types::Lid(if soft { 0 } else { 1 }),
        on_disconnect: None,
    });
    Arc::new(Session::connect(provider.clone(), Guid(initiator), direct, cfg).unwrap())
}

/// Holds whoever calls [`Gate::pass`] while closed (at most 10 s, so a
/// failing test ends).
#[derive(Default)]
pub struct Gate {
    closed: Mutex<bool>,
    cv: Condvar,
    /// Calls that found the gate closed.
    pub held: AtomicU64,
}

impl Gate {
    pub fn set(&self, closed: bool) {
        *self.closed.lock().unwrap() = closed;
        self.cv.notify_all();
    }

    pub fn pass(&self) {
        let mut c = self.closed.lock().unwrap();
        if *c {
            self.held.fetch_add(1, Ordering::SeqCst);
        }
        let end = Instant::now() + Duration::from_secs(10);
        while *c {
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            c = self.cv.wait_timeout(c, left).unwrap().0;
        }
    }
}

/// Which calls of a [`Held`] store wait at its gate.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Hold {
    Writes,
    Flushes,
}

/// A RAM store whose WRITEs (or flushes) wait at the gate while it is
/// closed: the target has the command but does not answer. Counts the
/// WRITEs that returned, one per command however many pieces it has.
pub struct Held {
    pub ram: scsi::Ram,
    pub gate: Arc<Gate>,
    pub hold: Hold,
    pub written: AtomicU64,
}

impl Held {
    pub fn new(bytes: u64, gate: Arc<Gate>, hold: Hold) -> Held {
        Held {
            ram: scsi::Ram::new(bytes),
            gate,
            hold,
            written: AtomicU64::new(0),
        }
    }

    fn pass(&self, what: Hold) {
        if self.hold == what {
            self.gate.pass();
        }
    }
}

impl scsi::Backend for Held {
    fn size(&self) -> u64 {
        self.ram.size()
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.ram.read(offset, buf)
    }
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> std::io::Result<()> {
        self.write_vectored(offset, &[data], fua)
    }
    fn write_vectored(&self, offset: u64, bufs: &[&[u8]], fua: bool) -> std::io::Result<()> {
        self.pass(Hold::Writes);
        let r = self.ram.write_vectored(offset, bufs, fua);
        self.written.fetch_add(1, Ordering::SeqCst);
        r
    }
    fn flush(&self) -> std::io::Result<()> {
        self.pass(Hold::Flushes);
        self.ram.flush()
    }
    fn unmap(&self, offset: u64, len: u64) -> std::io::Result<()> {
        self.ram.unmap(offset, len)
    }
}

/// Waits (bounded by `secs`) until `cond` holds.
pub fn wait_for(what: &str, secs: u64, mut cond: impl FnMut() -> bool) {
    let end = Instant::now() + Duration::from_secs(secs);
    while !cond() {
        assert!(Instant::now() < end, "{what}: not within {secs} s");
        std::thread::yield_now();
    }
}

/// One leg of a multipath device as the failover tests build it: a
/// [`RemoteDisk`](srp_initiator::remote::RemoteDisk) whose every (re)open
/// logs `initiator` in to `port` (target GUID `target`) through
/// [`Direct`], with a 1 MiB pool; it reconnects after 250 ms, fails I/O at
/// once while blocked and gives the device up after 120 s.
pub fn remote_path(
    provider: Arc<dyn verbs::Provider>,
    port: Arc<TargetPort>,
    (initiator, target): (u64, u64),
    lid: rdma_types::Lid,
    on_disconnect: Option<Arc<dyn Fn() + Send + Sync>>,
) -> Arc<srp_initiator::remote::RemoteDisk> {
    use srp_initiator::rport::RportConfig;
    let open = Box::new(move || {
        let chan = srp::initiator::ChannelConfig::new(1, Guid(initiator), target, Guid(target));
        let mut cfg = SessionConfig::new(chan);
        cfg.pool_bytes = 1 << 20;
        let direct = Arc::new(Direct {
            port: port.clone(),
            lid,
            on_disconnect: on_disconnect.clone(),
        });
        let s = Session::connect(provider.clone(), Guid(initiator), direct, cfg)
            .map_err(std::io::Error::other)?;
        srp_initiator::disk::Disk::open(Arc::new(s), 0)
    });
    let rport = RportConfig {
        reconnect_delay: Some(rdma_types::Duration::from_millis(250)),
        fast_io_fail_tmo: Some(rdma_types::Duration::ZERO),
        dev_loss_tmo: Some(rdma_types::Duration::from_secs(120)),
    };
    Arc::new(srp_initiator::remote::RemoteDisk::open(open, rport).unwrap())
}
