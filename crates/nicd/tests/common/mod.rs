//! A daemon in this process, serving soft RoCE CAs on loopback addresses
//! of 127.27.0.0/16 (no other test uses them), and what the tests share.

#![allow(dead_code)]

use nicd::{NicdProvider, Server};
use rdma_types::{Guid, Mtu, PortNum, Psn, QpState};
use rnic::softroce::{SoftCa, SoftRoce, ROCE_PORT};
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use verbs::conformance::{Feature, Fixture, Node};
use verbs::{Provider, QpAttr, QpHandle, Result};

/// A daemon on its own thread, its NIC and its socket.
pub struct Daemon {
    pub soft: Arc<SoftRoce>,
    pub server: Arc<Server>,
    pub path: PathBuf,
    pub guids: Vec<Guid>,
}

static NEXT: AtomicU32 = AtomicU32::new(0);

/// 127.27.`third`.x, a fresh x on each call (per test binary: each
/// binary passes its own `third` range).
pub fn fresh_ip(third: u8) -> IpAddr {
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    IpAddr::V4(Ipv4Addr::new(
        127,
        27,
        third + (n / 250) as u8,
        (n % 250) as u8 + 1,
    ))
}

impl Daemon {
    /// Serves a CA on each of `ips` (GUIDs 0x2701, 0x2702, ...).
    pub fn start(ips: &[IpAddr]) -> Daemon {
        Daemon::start_with(ips, nicd::Limits::default())
    }

    /// [`Daemon::start`], each client within `limits`.
    pub fn start_with(ips: &[IpAddr], limits: nicd::Limits) -> Daemon {
        Daemon::start_opts(ips, limits, false)
    }

    /// [`Daemon::start_with`]; the socket open to every user when
    /// `everyone` (as a root daemon's), else to ours only. The NICs'
    /// threads take the clients' rings, as `nicd`'s do.
    pub fn start_opts(ips: &[IpAddr], limits: nicd::Limits, everyone: bool) -> Daemon {
        Daemon::start_bare(ips, limits, everyone, true)
    }

    /// [`Daemon::start`] with a thread per client polling its rings
    /// (`nicd --ring-pollers`).
    pub fn start_pollers(ips: &[IpAddr]) -> Daemon {
        Daemon::start_bare(ips, nicd::Limits::default(), false, false)
    }

    /// [`Daemon::start_opts`] with the NICs' ports shared (`nicd`'s
    /// default): a `nicd::Direct` client runs its QPs in its process.
    pub fn start_shared(ips: &[IpAddr], limits: nicd::Limits, everyone: bool) -> Daemon {
        let d = Daemon::start_bare(ips, limits, everyone, true);
        let shared = nicd::shared::SharedPorts::new(d.soft.clone(), ROCE_PORT);
        for (ip, guid) in ips.iter().zip(&d.guids) {
            shared.share_ca(*guid, *ip).unwrap();
        }
        d.server.lend_ports_with(shared);
        d
    }

    fn start_bare(ips: &[IpAddr], limits: nicd::Limits, everyone: bool, feed: bool) -> Daemon {
        let cas: Vec<SoftCa> = ips
            .iter()
            .enumerate()
            .map(|(i, ip)| SoftCa {
                guid: Guid(0x2701 + i as u64),
                ip: *ip,
            })
            .collect();
        let guids = cas.iter().map(|c| c.guid).collect();
        let soft = SoftRoce::new(cas, ROCE_PORT);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("nicd-test-{}-{n}.sock", std::process::id()));
        let listener = nicd::server::bind(&path, everyone).unwrap();
        let server = Server::with_limits(soft.clone(), limits);
        if feed {
            server.set_data_path(Arc::new(soft.clone()));
        }
        server.serve(listener);
        Daemon {
            soft,
            server,
            path,
            guids,
        }
    }

    /// A new client connection.
    pub fn client(&self) -> Arc<NicdProvider> {
        NicdProvider::connect(&self.path).unwrap()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The conformance fixture: two CAs of one daemon, one client (whose
/// rings a poller takes: its queues are on two NICs); or, from
/// [`Two::one_nic`], both ends of every case on one CA, whose own thread
/// takes the client's rings.
pub struct Two {
    pub daemon: Daemon,
    pub client: Arc<NicdProvider>,
}

impl Two {
    pub fn new(third: u8) -> Two {
        let daemon = Daemon::start(&[fresh_ip(third), fresh_ip(third)]);
        let client = daemon.client();
        Two { daemon, client }
    }

    pub fn one_nic(third: u8) -> Two {
        let daemon = Daemon::start(&[fresh_ip(third)]);
        let client = daemon.client();
        Two { daemon, client }
    }
}

impl Fixture for Two {
    fn provider(&self) -> Arc<dyn Provider> {
        self.client.clone()
    }
    fn guids(&self) -> (Guid, Guid) {
        let g = &self.daemon.guids;
        (g[0], g[g.len() - 1])
    }
    /// Port control is the daemon's NIC's (the tests act as its admin);
    /// the events reach the client through the daemon.
    fn set_port_active(&self, guid: Guid, active: bool) -> Result<()> {
        self.daemon.soft.set_port_active(guid, active)
    }
    fn set_lid(&self, guid: Guid, lid: rdma_types::Lid) -> Result<()> {
        self.daemon.soft.set_lid(guid, lid)
    }
    fn remove_ca(&self, guid: Guid) -> Result<()> {
        self.daemon.soft.remove_ca(guid)
    }
    /// As the soft RoCE fixture: a `roce` port's P_Key table is fixed;
    /// no alternate paths on soft RoCE; QP1 is a place at the daemon's
    /// shared QP1, which routes MADs by their contents (no raw sends; on
    /// one NIC `special_qps` is not run: it opens a QP1 at each end, and
    /// a client has one per port).
    fn lacks(&self) -> Vec<Feature> {
        let mut gaps = vec![Feature::Apm, Feature::PkeyControl];
        if self.daemon.guids.len() > 1 {
            gaps.push(Feature::RawGsi);
        }
        gaps
    }
}

/// One client's view of a CA, to open a conformance `Node` with: the
/// daemon's client itself, or `nicd::Direct` (its QPs in this process).
pub struct One<P = NicdProvider>(pub Arc<P>, pub Guid);

impl<P: Provider + 'static> Fixture for One<P> {
    fn provider(&self) -> Arc<dyn Provider> {
        self.0.clone()
    }
    fn guids(&self) -> (Guid, Guid) {
        (self.1, self.1)
    }
    fn set_port_active(&self, _: Guid, _: bool) -> Result<()> {
        Err(verbs::VerbsError::NotSupported("port control"))
    }
    fn set_lid(&self, _: Guid, _: rdma_types::Lid) -> Result<()> {
        Err(verbs::VerbsError::NotSupported("port control"))
    }
    fn remove_ca(&self, _: Guid) -> Result<()> {
        Err(verbs::VerbsError::NotSupported("port control"))
    }
    fn lacks(&self) -> Vec<Feature> {
        Vec::new()
    }
}

/// Two clients of `d`'s first NIC, each a conformance node with a CQ of
/// `cqe`, and an RC QP of each (contexts 1 and 2) connected with
/// `rnr_retry` `rnr` (`verbs::conformance::connect`).
pub struct RcPair {
    pub ca: One,
    pub cb: One,
    pub a: Node,
    pub b: Node,
    pub qa: QpHandle,
    pub qb: QpHandle,
}

pub fn rc_pair(d: &Daemon, cqe: u32, rnr: u8) -> RcPair {
    let g = d.guids[0];
    let (ca, cb) = (One(d.client(), g), One(d.client(), g));
    let (a, b) = (Node::open(&ca, g, cqe), Node::open(&cb, g, cqe));
    let (qa, qb) = (
        a.qp(rdma_types::QpType::Rc, None, 1),
        b.qp(rdma_types::QpType::Rc, None, 2),
    );
    verbs::conformance::connect(&a, qa, &b, qb, rdma_types::QpType::Rc, rnr);
    RcPair {
        ca,
        cb,
        a,
        b,
        qa,
        qb,
    }
}

/// Takes RC QP `q` of `n` to RTS, connected to QP `dest` at `peer`'s
/// port (PSNs 0, rnr_retry 7, retries 7 of about 67 ms each).
pub fn rc_to(n: &Node, q: QpHandle, peer_av: verbs::AhAttr, dest: rdma_types::Qpn) {
    use rdma_types::AccessFlags as A;
    let p = &n.p;
    p.modify_qp(
        q,
        &QpAttr {
            state: Some(QpState::Init),
            pkey_index: Some(0),
            port: Some(PortNum(1)),
            access: Some(A::REMOTE_WRITE | A::REMOTE_READ | A::REMOTE_ATOMIC),
            ..Default::default()
        },
    )
    .unwrap();
    p.modify_qp(
        q,
        &QpAttr {
            state: Some(QpState::Rtr),
            av: Some(peer_av),
            path_mtu: Some(Mtu::Mtu1024),
            dest_qpn: Some(dest),
            rq_psn: Some(Psn::new(0)),
            max_dest_rd_atomic: Some(4),
            min_rnr_timer: Some(1),
            ..Default::default()
        },
    )
    .unwrap();
    p.modify_qp(
        q,
        &QpAttr {
            state: Some(QpState::Rts),
            sq_psn: Some(Psn::new(0)),
            timeout: Some(14),
            retry_cnt: Some(7),
            rnr_retry: Some(7),
            max_rd_atomic: Some(4),
            ..Default::default()
        },
    )
    .unwrap();
}

/// A new RC QP of `n` taken to INIT with one receive posted, then to ERR:
/// the receive completes flushed (what a test waiting on `n`'s CQ needs
/// one completion for).
pub fn flush_a_receive(n: &Node) {
    let q = n.qp(rdma_types::QpType::Rc, None, 1);
    let step = |a: QpAttr| n.p.modify_qp(q, &a).unwrap();
    step(QpAttr {
        state: Some(QpState::Init),
        pkey_index: Some(0),
        port: Some(PortNum(1)),
        access: Some(rdma_types::AccessFlags::NONE),
        ..Default::default()
    });
    n.post_one_recv(q, 1, 0, 16);
    step(QpAttr {
        state: Some(QpState::Err),
        ..Default::default()
    });
}

/// A `nicd` process serving two fresh addresses of 127.27.`third`.x on
/// a socket of its own (as users run it), and a client of it: `wrap`
/// makes the tests' provider of the daemon's client (itself, or
/// `nicd::Direct`). Port control is the daemon's own NIC's, out of this
/// process's reach: declared missing.
pub struct Spawned<P> {
    pub nicd: std::process::Child,
    pub client: Arc<P>,
    pub guids: (Guid, Guid),
    pub socket: PathBuf,
}

impl<P> Spawned<P> {
    pub fn start(third: u8, wrap: impl FnOnce(Arc<NicdProvider>) -> Arc<P>) -> Spawned<P> {
        use std::io::BufRead;
        let (a, b) = (fresh_ip(third), fresh_ip(third));
        let socket =
            std::env::temp_dir().join(format!("nicd-proc-{}-{a}.sock", std::process::id()));
        let mut nicd = std::process::Command::new(env!("CARGO_BIN_EXE_nicd"))
            .args(["--ip", &a.to_string(), "--ip", &b.to_string(), "--socket"])
            .arg(&socket)
            .env("SOFTROCE_FOLLOW_LINK", "0")
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(nicd.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert!(line.starts_with("nicd: serving"), "{line:?}");
        let guid = |ip: IpAddr| rnic::softroce::ip_guid(ip);
        let client = wrap(NicdProvider::connect(&socket).unwrap());
        Spawned {
            nicd,
            client,
            guids: (guid(a), guid(b)),
            socket,
        }
    }
}

impl<P> Drop for Spawned<P> {
    fn drop(&mut self) {
        let _ = self.nicd.kill();
        let _ = self.nicd.wait();
        let _ = std::fs::remove_file(&self.socket);
    }
}

impl<P: Provider + 'static> Fixture for Spawned<P> {
    fn provider(&self) -> Arc<dyn Provider> {
        self.client.clone()
    }
    fn guids(&self) -> (Guid, Guid) {
        self.guids
    }
    fn set_port_active(&self, _: Guid, _: bool) -> Result<()> {
        Err(verbs::VerbsError::NotSupported(
            "port control of another process's NIC",
        ))
    }
    fn set_lid(&self, _: Guid, _: rdma_types::Lid) -> Result<()> {
        Err(verbs::VerbsError::NotSupported(
            "port control of another process's NIC",
        ))
    }
    fn remove_ca(&self, _: Guid) -> Result<()> {
        Err(verbs::VerbsError::NotSupported(
            "port control of another process's NIC",
        ))
    }
    /// Soft RoCE's gaps, raw QP1 sends (the daemon's QP1 is shared and
    /// routes by contents), and port control (the pkey_change case asks
    /// for it first).
    fn lacks(&self) -> Vec<Feature> {
        vec![Feature::Apm, Feature::PortControl, Feature::RawGsi]
    }
}
