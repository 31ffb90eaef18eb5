//! What the tests of the soft iWARP NIC share: the conformance fixture
//! (a provider of two NICs on 127.94.x.y addresses) and a raw iWARP peer
//! that speaks to a NIC over a plain TCP socket, driving the `iwarp`
//! engine by hand so it can send what a good peer never would.

#![allow(dead_code)]

use iwarp::fuzz::TestMemory;
use iwarp::{Completion, Config, Connection, Event, Role};
use iwarp_tcp::rendezvous::Rendezvous;
use iwarp_tcp::{IwarpCa, NicOptions, SoftIwarp};
use rdma_types::{AccessFlags, Gid, Guid, Lid, Mtu, Psn, QpState, Qpn};
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};
use verbs::conformance::{Feature, Fixture, Node};
use verbs::{AhAttr, Provider, QpAttr, QpHandle, Result, VerbsError};

/// The conformance fixture: one provider, two NICs.
pub struct Iwarp {
    pub p: Arc<SoftIwarp>,
    pub guids: (Guid, Guid),
}

/// A provider of NICs at `a` and `b`.
pub fn pair(a: IpAddr, b: IpAddr) -> Iwarp {
    pair_with(a, b, NicOptions::default())
}

/// A provider of NICs at `a` and `b` with `options`.
pub fn pair_with(a: IpAddr, b: IpAddr, options: NicOptions) -> Iwarp {
    let (a, b) = (IwarpCa::at(a), IwarpCa::at(b));
    let guids = (a.guid, b.guid);
    Iwarp {
        p: SoftIwarp::with_options(vec![a, b], options),
        guids,
    }
}

impl Fixture for Iwarp {
    fn provider(&self) -> Arc<dyn Provider> {
        self.p.clone()
    }
    fn guids(&self) -> (Guid, Guid) {
        self.guids
    }
    fn set_port_active(&self, _: Guid, _: bool) -> Result<()> {
        Err(VerbsError::NotSupported("port control of an iWARP NIC"))
    }
    fn set_lid(&self, _: Guid, _: Lid) -> Result<()> {
        Err(VerbsError::NotSupported("LIDs on iWARP"))
    }
    fn remove_ca(&self, _: Guid) -> Result<()> {
        Err(VerbsError::NotSupported("CA removal of an iWARP NIC"))
    }
    fn lacks(&self) -> Vec<Feature> {
        vec![
            Feature::Uc,
            Feature::Ud,
            Feature::SpecialQp,
            Feature::Mw,
            Feature::Atomics,
            Feature::PortControl,
            Feature::Apm,
            Feature::Immediate,
            Feature::RemoteErrorCompletion,
        ]
    }
}

/// Takes `qp` of `n` to RTS towards QP `peer_qpn` at `peer`.
pub fn ready(n: &Node, qp: QpHandle, peer: IpAddr, peer_qpn: u32) {
    init(n, qp);
    connect(n, qp, peer, peer_qpn);
}

/// Takes `qp` of `n` to INIT (receives may be posted).
pub fn init(n: &Node, qp: QpHandle) {
    n.p.modify_qp(
        qp,
        &QpAttr {
            state: Some(QpState::Init),
            pkey_index: Some(0),
            port: Some(rdma_types::PortNum(1)),
            access: Some(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ),
            ..Default::default()
        },
    )
    .unwrap();
}

/// Takes `qp` of `n` from INIT to RTS towards QP `peer_qpn` at `peer`.
pub fn connect(n: &Node, qp: QpHandle, peer: IpAddr, peer_qpn: u32) {
    rtr(n, qp, peer, peer_qpn);
    rts(n, qp);
}

/// Takes `qp` of `n` from INIT to RTR towards QP `peer_qpn` at `peer`.
pub fn rtr(n: &Node, qp: QpHandle, peer: IpAddr, peer_qpn: u32) {
    n.p.modify_qp(
        qp,
        &QpAttr {
            state: Some(QpState::Rtr),
            av: Some(AhAttr::roce(Gid::from_ip(peer))),
            path_mtu: Some(Mtu::Mtu1024),
            dest_qpn: Some(Qpn::from_bits(peer_qpn)),
            rq_psn: Some(Psn::new(0)),
            max_dest_rd_atomic: Some(4),
            min_rnr_timer: Some(1),
            ..Default::default()
        },
    )
    .unwrap();
}

/// Takes `qp` of `n` from RTR to RTS.
pub fn rts(n: &Node, qp: QpHandle) {
    n.p.modify_qp(
        qp,
        &QpAttr {
            state: Some(QpState::Rts),
            sq_psn: Some(Psn::new(0)),
            timeout: Some(14),
            retry_cnt: Some(7),
            rnr_retry: Some(0),
            max_rd_atomic: Some(4),
            ..Default::default()
        },
    )
    .unwrap();
}

/// How long a raw peer waits for anything.
pub const PATIENCE: Duration = Duration::from_secs(10);

/// An iWARP initiator on a plain blocking socket, its engine driven here.
pub struct RawPeer {
    pub s: TcpStream,
    pub c: Connection,
    pub mem: TestMemory,
    pub events: Vec<Event>,
    pub done: Vec<Completion>,
    epoch: Instant,
}

impl RawPeer {
    /// Connects from `from` to the NIC at `nic` as QP `qpn`, asking for the
    /// NIC's QP `nic_qpn`, and completes the MPA exchange.
    pub fn connect(from: IpAddr, nic: SocketAddr, qpn: u32, nic_qpn: u32) -> RawPeer {
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        s.bind(&SocketAddr::new(from, 0).into()).unwrap();
        s.connect_timeout(&nic.into(), PATIENCE).unwrap();
        let s = TcpStream::from(s);
        s.set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let r = Rendezvous {
            initiator_qpn: qpn,
            responder_qpn: nic_qpn,
        };
        let cfg = Config {
            private_data: r.emit(),
            ..Config::new(Role::Initiator)
        };
        let epoch = Instant::now();
        let c = Connection::new(cfg, rdma_types::Instant::ZERO).unwrap();
        let mut p = RawPeer {
            s,
            c,
            mem: TestMemory::default(),
            events: Vec::new(),
            done: Vec::new(),
            epoch,
        };
        p.flush();
        assert!(
            p.pump_until(|e| matches!(e, Event::Established { .. })),
            "no MPA reply: {:?}",
            p.events
        );
        p
    }

    fn now(&self) -> rdma_types::Instant {
        rdma_types::Instant::from_micros(self.epoch.elapsed().as_micros() as u64)
    }

    /// Writes everything the engine has to send.
    pub fn flush(&mut self) {
        let mut out = Vec::new();
        let now = self.now();
        while self.c.poll_transmit(now, &mut self.mem, &mut out) {}
        self.s.write_all(&out).unwrap();
        self.collect();
    }

    fn collect(&mut self) {
        while let Some(e) = self.c.poll_event() {
            self.events.push(e);
        }
        while let Some(c) = self.c.poll_completion() {
            self.done.push(c);
        }
    }

    /// Reads and feeds the engine until an event matches (true) or the
    /// stream ends or [`PATIENCE`] passes (false).
    pub fn pump_until(&mut self, pred: impl Fn(&Event) -> bool) -> bool {
        let deadline = Instant::now() + PATIENCE;
        let mut buf = vec![0u8; 65536];
        loop {
            if self.events.iter().any(&pred) {
                return true;
            }
            if Instant::now() > deadline {
                return false;
            }
            match self.s.read(&mut buf) {
                Ok(0) => return self.events.iter().any(&pred),
                Ok(n) => {
                    let now = self.now();
                    self.c.handle_bytes(now, &buf[..n], &mut self.mem);
                    self.collect();
                }
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(_) => return self.events.iter().any(&pred),
            }
        }
    }
}
